package io.ragsidecar.client;

/** What the sidecar does with a document longer than the model's input window. */
public enum LongDocumentStrategy {
  /** Cut the document's tail; the query is never cut. */
  TRUNCATE,
  /**
   * Score overlapping windows of the document separately; the best window's score wins (bounded by the model's
   * maximum number of windows per document).
   */
  WINDOW;

  ragsidecar.v1.Reranker.LongDocumentStrategy toProto() {
    return this == TRUNCATE
        ? ragsidecar.v1.Reranker.LongDocumentStrategy.LONG_DOCUMENT_STRATEGY_TRUNCATE
        : ragsidecar.v1.Reranker.LongDocumentStrategy.LONG_DOCUMENT_STRATEGY_WINDOW;
  }

  /** Null for the unspecified (or an unknown future) value. */
  static LongDocumentStrategy fromProto(ragsidecar.v1.Reranker.LongDocumentStrategy proto) {
    switch (proto) {
      case LONG_DOCUMENT_STRATEGY_TRUNCATE:
        return TRUNCATE;
      case LONG_DOCUMENT_STRATEGY_WINDOW:
        return WINDOW;
      default:
        return null;
    }
  }
}
