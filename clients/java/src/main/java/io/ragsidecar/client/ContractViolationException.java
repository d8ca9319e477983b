package io.ragsidecar.client;

import io.grpc.Status;
import java.util.Map;

/**
 * The sidecar answered, but its response breaks the contract the client relies on: for example a rerank result
 * that references a document the request did not contain, or the same document twice (the {@link Reranker}
 * invariant the host runtime validates). Code {@code INTERNAL}, reason {@code CONTRACT_VIOLATION}; there is no
 * status cause.
 */
public class ContractViolationException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  /** The reason reported by {@link #reason()}. */
  public static final String REASON = "CONTRACT_VIOLATION";

  ContractViolationException(String message) {
    super(message, Status.INTERNAL.withDescription(message), null, REASON, "", Map.of(), null);
  }
}
