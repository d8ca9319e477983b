package io.ragsidecar.client;

/**
 * Status {@code FAILED_PRECONDITION} with reason {@code KNOWLEDGE_NOT_READY}: a configured knowledge source is missing,
 * holds no unit yet, or is unreadable. {@link #sources()} names every failing source (sorted, from the ErrorInfo
 * metadata {@code "sources"}), and {@link #violations()} says why for each ({@code field = "knowledge[<name>]"}).
 */
public class KnowledgeNotReadyException extends FailedPreconditionException {
  private static final long serialVersionUID = 1L;

  KnowledgeNotReadyException(ErrorDetails details) {
    super(details);
  }
}
