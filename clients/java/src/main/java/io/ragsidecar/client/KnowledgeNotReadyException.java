package io.ragsidecar.client;

/**
 * Status {@code FAILED_PRECONDITION} with reason {@code KNOWLEDGE_NOT_READY}: a configured knowledge source holds no unit
 * yet, or is unreadable.
 */
public class KnowledgeNotReadyException extends FailedPreconditionException {
  private static final long serialVersionUID = 1L;

  KnowledgeNotReadyException(ErrorDetails details) {
    super(details);
  }
}
