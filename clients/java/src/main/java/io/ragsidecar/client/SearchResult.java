package io.ragsidecar.client;

import io.ragsidecar.v1.RetrievedChunk;
import io.ragsidecar.v1.SearchResponse;
import io.ragsidecar.v1.Timing;
import io.ragsidecar.v1.Usage;
import java.util.List;
import java.util.Objects;
import java.util.OptionalDouble;

/**
 * What {@link SidecarRetrieval#search} found: the hits of every searched source merged in descending score (ties:
 * source name, then chunk id), at most {@code top_k} per source.
 *
 * @param hits the hits, best first
 * @param staleFallbacks sources served from their last good index because a reload failed; empty when none
 * @param proto the sidecar's answer as sent, for what the typed view leaves out
 */
public record SearchResult(List<Hit> hits, List<RetrievedContext.StaleFallback> staleFallbacks, SearchResponse proto) {

  public SearchResult {
    hits = List.copyOf(hits);
    staleFallbacks = List.copyOf(staleFallbacks);
    Objects.requireNonNull(proto, "proto");
  }

  static SearchResult fromProto(SearchResponse r) {
    return new SearchResult(r.getHitsList().stream().map(Hit::fromProto).toList(),
        r.getStaleFallbacksList().stream().map(RetrievedContext.StaleFallback::fromProto).toList(), r);
  }

  /** Whether nothing matched. */
  public boolean isEmpty() {
    return hits.isEmpty();
  }

  /** Embedding and rerank work spent. */
  public Usage usage() {
    return proto.getUsage();
  }

  /** Server-side timings. */
  public Timing timing() {
    return proto.getTiming();
  }

  /**
   * One chunk a search returned.
   *
   * @param chunkId stable chunk id, derived from the source name, the chunk's position and its content hash
   * @param source the knowledge source's name
   * @param text the chunk's text as given to the model
   * @param score what hits are ranked by: the fused retrieval score, or for an entry that reranks, by default the
   *     fusion of the reranker's order with the retrieval order (the rerank relevance itself with
   *     {@link RetrievalRequests#rerank RERANK_ORDER_RERANKER})
   * @param rerankScore the reranker's relevance (0..1); empty when the entry does not rerank, and on hits past
   *     the rerank depth
   * @param documentId the MEMORY document's id, or the record key of a .jsonl/.csv record; empty otherwise
   * @param file the source file's path relative to its knowledge root; empty for INLINE and MEMORY
   * @param proto the chunk as sent, with its full provenance (lines, page, offsets) and pipeline scores
   */
  public record Hit(String chunkId, String source, String text, double score, OptionalDouble rerankScore,
      String documentId, String file, RetrievedChunk proto) {

    public Hit {
      Objects.requireNonNull(chunkId, "chunkId");
      Objects.requireNonNull(source, "source");
      Objects.requireNonNull(text, "text");
      Objects.requireNonNull(rerankScore, "rerankScore");
      Objects.requireNonNull(documentId, "documentId");
      Objects.requireNonNull(file, "file");
      Objects.requireNonNull(proto, "proto");
    }

    static Hit fromProto(RetrievedChunk c) {
      OptionalDouble rerank = c.getScores().hasRerank()
          ? OptionalDouble.of(c.getScores().getRerank())
          : OptionalDouble.empty();
      return new Hit(c.getChunkId(), c.getSource(), c.getText(), c.getScore(), rerank,
          c.getProvenance().getDocumentId(), c.getProvenance().getFile(), c);
    }
  }
}
