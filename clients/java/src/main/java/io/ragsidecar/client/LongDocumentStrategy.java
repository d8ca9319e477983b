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

  io.ragsidecar.v1.LongDocumentStrategy toProto() {
    return this == TRUNCATE
        ? io.ragsidecar.v1.LongDocumentStrategy.LONG_DOCUMENT_STRATEGY_TRUNCATE
        : io.ragsidecar.v1.LongDocumentStrategy.LONG_DOCUMENT_STRATEGY_WINDOW;
  }

  /** Null for the unspecified (or an unknown future) value. */
  static LongDocumentStrategy fromProto(io.ragsidecar.v1.LongDocumentStrategy proto) {
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
