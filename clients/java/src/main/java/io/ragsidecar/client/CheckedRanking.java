package io.ragsidecar.client;

import java.util.ArrayList;
import java.util.BitSet;
import java.util.Collections;
import java.util.List;

/**
 * A {@link Reranker}'s answer checked against its request: every result references a document that was given, each
 * at most once. The sidecar's client guarantees this already; a host's own {@code Reranker} may not, and a broken
 * answer then fails with an {@link IllegalStateException} naming the index and the number of documents, never an
 * {@code ArrayIndexOutOfBoundsException} deep in an adapter. Both JVM adapters rerank through here.
 */
public final class CheckedRanking {
  private CheckedRanking() {}

  /**
   * The reranker's results for this request, in its order (descending relevance).
   *
   * @throws IllegalStateException when a result's index is outside the request's documents, or repeats one
   */
  public static List<Reranker.RankedDocument> rerank(Reranker reranker, Reranker.Request request) {
    List<Reranker.RankedDocument> ranked = reranker.rerank(request);
    int size = request.documents().size();
    BitSet seen = new BitSet(size);
    for (Reranker.RankedDocument result : ranked) {
      int index = result.index();
      if (index < 0 || index >= size) {
        throw new IllegalStateException("reranker result references document index " + index + ", but "
            + size + " documents were given (0.." + (size - 1) + ")");
      }
      if (seen.get(index)) {
        throw new IllegalStateException("reranker result references document index " + index + " twice");
      }
      seen.set(index);
    }
    return ranked;
  }

  /**
   * One relevance per document of the request, in the documents' order: the reranker's relevance, or 0 for a
   * document it dropped (a threshold or {@code topN}); {@code NaN} where it gave no score ({@link Reranker#noOp()}).
   *
   * @throws IllegalStateException as {@link #rerank}
   */
  public static List<Double> scoreAll(Reranker reranker, Reranker.Request request) {
    List<Double> scores = new ArrayList<>(Collections.nCopies(request.documents().size(), 0.0));
    for (Reranker.RankedDocument result : rerank(reranker, request)) {
      scores.set(result.index(), (double) result.relevanceScore());
    }
    return Collections.unmodifiableList(scores);
  }
}
