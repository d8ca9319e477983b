package io.ragsidecar.client;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Objects;

/**
 * A search hit as a framework document: the one layout the JVM adapters (LangChain4j, Spring AI) give every hit, so
 * that a host moving between them reads the same keys.
 *
 * <ul>
 *   <li>{@link #id()}: the hit's chunk id (a framework without document ids finds it under {@link #CHUNK_ID});
 *   <li>{@link #text()}: the chunk's text;
 *   <li>{@link #metadata()}: {@link #SOURCE} and {@link #CHUNK_ID} always; {@link #DOCUMENT_ID} and {@link #FILE}
 *       when not empty; {@link #RERANK_SCORE} when the entry reranked the hit;
 *   <li>{@link #score()}: the hit's score, {@code null} for unranked (DIRECT, SEQUENTIAL) text.
 * </ul>
 *
 * @param id the chunk id
 * @param text the chunk's text
 * @param metadata the keys above, values {@code String} or {@code Double}; unmodifiable, in the order above
 * @param score the hit's score, or {@code null} when it was not ranked
 */
public record HitDocument(String id, String text, Map<String, Object> metadata, Double score) {
  /** Metadata key: the knowledge entry's name. */
  public static final String SOURCE = "source";
  /** Metadata key: the chunk id, also the document's id where the framework has one. */
  public static final String CHUNK_ID = "chunk_id";
  /** Metadata key: the MEMORY document's id, or the record key of a .jsonl/.csv record. */
  public static final String DOCUMENT_ID = "document_id";
  /** Metadata key: the source file's path relative to its knowledge root. */
  public static final String FILE = "file";
  /** Metadata key: the reranker's relevance (0..1) when the entry reranks. */
  public static final String RERANK_SCORE = "rerank_score";

  public HitDocument {
    Objects.requireNonNull(id, "id");
    Objects.requireNonNull(text, "text");
    metadata = Collections.unmodifiableMap(new LinkedHashMap<>(metadata));
  }

  /** The document of this hit. */
  public static HitDocument of(KnowledgeChunk hit) {
    Map<String, Object> metadata = new LinkedHashMap<>();
    metadata.put(SOURCE, hit.source());
    metadata.put(CHUNK_ID, hit.chunkId());
    if (!hit.documentId().isEmpty()) {
      metadata.put(DOCUMENT_ID, hit.documentId());
    }
    if (!hit.file().isEmpty()) {
      metadata.put(FILE, hit.file());
    }
    hit.rerankScore().ifPresent(relevance -> metadata.put(RERANK_SCORE, relevance));
    return new HitDocument(hit.chunkId(), hit.text(), metadata, hit.isScored() ? hit.score() : null);
  }
}
