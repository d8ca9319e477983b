package io.ragsidecar.client;

/**
 * Status {@code FAILED_PRECONDITION}: the sidecar's state does not allow the request (see
 * {@link KnowledgeNotReadyException}).
 */
public class FailedPreconditionException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  FailedPreconditionException(ErrorDetails details) {
    super(details);
  }
}
