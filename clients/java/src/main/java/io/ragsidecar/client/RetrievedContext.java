package io.ragsidecar.client;

import java.time.Instant;
import java.util.List;
import java.util.Objects;
import io.ragsidecar.v1.Timing;
import io.ragsidecar.v1.Usage;
import io.ragsidecar.v1.ContextBlock;
import io.ragsidecar.v1.KnowledgeUse;
import io.ragsidecar.v1.EnforceResponse;

/**
 * What {@link SidecarRetrieval#enforce} gives an action: the values the host's {@code RetrievalSpi.enforce} puts into
 * the action's context map, plus the blocks behind them.
 *
 * <table>
 *   <caption>Host context keys</caption>
 *   <tr><th>Accessor</th><th>Host key</th></tr>
 *   <tr><td>{@link #retrievedContext()}</td><td>{@code RETRIEVED_CONTEXT_KEY}</td></tr>
 *   <tr><td>{@link #documentCount()}</td><td>{@code RETRIEVED_DOCUMENT_COUNT_KEY}</td></tr>
 *   <tr><td>{@link #staleFallbacks()}</td><td>{@code RETRIEVED_STALE_FALLBACK_KEY}</td></tr>
 *   <tr><td>{@link #truncated()}</td><td>{@code RETRIEVED_CONTEXT_TRUNCATED_KEY}</td></tr>
 * </table>
 *
 * @param retrievedContext the formatted context for the action's prompt; empty when nothing was retrieved
 * @param documentCount number of chunks assembled into {@code retrievedContext}
 * @param staleFallbacks sources served from their last good index because a reload failed; empty when none
 * @param truncated whether {@code retrievedContext} lost anything to the context window
 * @param blocks one block per source, in the action's knowledge order, with their chunks and provenance
 * @param query the query SEARCH entries ran with; empty when there was none
 * @param usage embedding and rerank work spent
 * @param timing server-side timings
 */
public record RetrievedContext(
    String retrievedContext,
    int documentCount,
    List<StaleFallback> staleFallbacks,
    boolean truncated,
    List<Block> blocks,
    String query,
    Usage usage,
    Timing timing) {

  public RetrievedContext {
    Objects.requireNonNull(retrievedContext, "retrievedContext");
    staleFallbacks = List.copyOf(staleFallbacks);
    blocks = List.copyOf(blocks);
    query = query == null ? "" : query;
  }

  static RetrievedContext fromProto(EnforceResponse r) {
    return new RetrievedContext(r.getRetrievedContext(), r.getDocumentCount(),
        r.getStaleFallbacksList().stream().map(StaleFallback::fromProto).toList(), r.getTruncated(),
        r.getBlocksList().stream().map(Block::fromProto).toList(), r.getQuery(), r.getUsage(), r.getTiming());
  }

  /** Whether nothing was retrieved (the benign empty case). */
  public boolean isEmpty() {
    return retrievedContext.isEmpty();
  }

  /** The names of the sources in {@link #staleFallbacks()}, in order. */
  public List<String> staleSources() {
    return staleFallbacks.stream().map(StaleFallback::source).toList();
  }

  /**
   * The text one knowledge source contributed to the context.
   *
   * @param source the knowledge source's name
   * @param use how it was consumed
   * @param chunks the chunks given, in the order they appear in the block: source order for DIRECT and SEQUENTIAL
   *     (unscored), descending score for SEARCH
   * @param tokens tokens the rendered block takes, as the sidecar's token counter counts them
   * @param truncated whether the block lost text to the context window
   */
  public record Block(String source, KnowledgeUse use, List<KnowledgeChunk> chunks, int tokens, boolean truncated) {
    public Block {
      Objects.requireNonNull(source, "source");
      Objects.requireNonNull(use, "use");
      chunks = List.copyOf(chunks);
    }

    static Block fromProto(ContextBlock b) {
      return new Block(b.getSource(), b.getUse(), b.getChunksList().stream().map(KnowledgeChunk::fromProto).toList(),
          b.getTokens(), b.getTruncated());
    }
  }

  /**
   * A source served from its last good index because its reload failed.
   *
   * @param source the knowledge source's name
   * @param reason why the reload failed (human-readable)
   * @param lastGoodBuiltAt when the index being served was built; {@code null} when the sidecar did not say
   */
  public record StaleFallback(String source, String reason, Instant lastGoodBuiltAt) {
    static StaleFallback fromProto(io.ragsidecar.v1.StaleFallback f) {
      Instant built = f.hasLastGoodBuiltAt()
          ? Instant.ofEpochSecond(f.getLastGoodBuiltAt().getSeconds(), f.getLastGoodBuiltAt().getNanos())
          : null;
      return new StaleFallback(f.getSource(), f.getReason(), built);
    }
  }
}
