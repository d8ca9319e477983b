package io.ragsidecar.client;

import java.util.ArrayList;
import java.util.List;

/**
 * Rerankers a host writes itself, for tests: the client and its adapters take any {@link Reranker}, so they must hold
 * a host's own implementation to the Reranker SPI as they hold the sidecar's.
 */
public final class HostRerankers {
  private HostRerankers() {}

  /** A host's own reranker that supports every model and answers these indexes, in this order, relevance index / 4. */
  public static Reranker answering(int... indexes) {
    return new Reranker() {
      @Override
      public boolean supports(String model) {
        return true;
      }

      @Override
      public List<RankedDocument> rerank(Request request) {
        List<RankedDocument> ranked = new ArrayList<>();
        for (int index : indexes) {
          ranked.add(new RankedDocument(index, "", index / 4f, 0f, null, 0));
        }
        return ranked;
      }
    };
  }
}
