package io.ragsidecar.client;

import io.ragsidecar.v1.RetrievedChunk;
import java.util.Map;
import java.util.Objects;
import java.util.OptionalDouble;

/**
 * One chunk of retrieved text: a {@link SearchResult} hit, or a chunk of a {@link RetrievedContext.Block}.
 *
 * @param chunkId stable chunk id, derived from the source name, the chunk's position and its content hash
 * @param source the knowledge source's name
 * @param text the chunk's text as given to the model
 * @param score what hits are ranked by: the fused retrieval score, or for an entry that reranks, by default the
 *     reranker's relevance combined with the retrieval order (the rerank relevance itself with
 *     {@link RetrievalRequests#rerank RERANK_ORDER_RERANKER}); {@code NaN} (unscored) for DIRECT and SEQUENTIAL
 *     text, which is not ranked
 * @param rerankScore the reranker's relevance (0..1); empty when the entry does not rerank, and on hits past the
 *     rerank depth
 * @param documentId the MEMORY document's id, or the record key of a .jsonl/.csv record; empty otherwise
 * @param file the source file's path relative to its knowledge root; empty for INLINE and MEMORY
 * @param proto the chunk as sent, with its full provenance (lines, page, offsets) and pipeline scores
 */
public record KnowledgeChunk(String chunkId, String source, String text, double score, OptionalDouble rerankScore,
    String documentId, String file, RetrievedChunk proto) {

  public KnowledgeChunk {
    Objects.requireNonNull(chunkId, "chunkId");
    Objects.requireNonNull(source, "source");
    Objects.requireNonNull(text, "text");
    Objects.requireNonNull(rerankScore, "rerankScore");
    Objects.requireNonNull(documentId, "documentId");
    Objects.requireNonNull(file, "file");
    Objects.requireNonNull(proto, "proto");
  }

  static KnowledgeChunk fromProto(RetrievedChunk c) {
    OptionalDouble rerank = c.getScores().hasRerank()
        ? OptionalDouble.of(c.getScores().getRerank())
        : OptionalDouble.empty();
    return new KnowledgeChunk(c.getChunkId(), c.getSource(), c.getText(), c.hasScore() ? c.getScore() : Double.NaN,
        rerank, c.getProvenance().getDocumentId(), c.getProvenance().getFile(), c);
  }

  /**
   * The metadata of the hit's MEMORY or chat-binding document (its typed metadata, and its string metadata as
   * strings), as {@link Metadata#toJava} gives them; empty for other sources.
   */
  public Map<String, Object> metadata() {
    return Metadata.toJava(proto.getMetadataMap());
  }

  /** Whether the chunk was ranked (SEARCH); DIRECT and SEQUENTIAL text is not, and its {@link #score()} is NaN. */
  public boolean isScored() {
    return !Double.isNaN(score);
  }
}
