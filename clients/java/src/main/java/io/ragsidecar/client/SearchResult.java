package io.ragsidecar.client;

import io.ragsidecar.v1.SearchResponse;
import io.ragsidecar.v1.Timing;
import io.ragsidecar.v1.Usage;
import java.util.List;
import java.util.Objects;

/**
 * What {@link SidecarRetrieval#search} found: the hits of every searched source merged in descending score (ties:
 * source name, then chunk id), at most {@code top_k} per source.
 *
 * @param hits the hits, best first
 * @param staleFallbacks sources served from their last good index because a reload failed; empty when none
 * @param proto the sidecar's answer as sent, for what the typed view leaves out
 */
public record SearchResult(List<KnowledgeChunk> hits, List<RetrievedContext.StaleFallback> staleFallbacks,
    SearchResponse proto) {

  public SearchResult {
    hits = List.copyOf(hits);
    staleFallbacks = List.copyOf(staleFallbacks);
    Objects.requireNonNull(proto, "proto");
  }

  static SearchResult fromProto(SearchResponse r) {
    return new SearchResult(r.getHitsList().stream().map(KnowledgeChunk::fromProto).toList(),
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
}
