package io.ragsidecar.client;

/**
 * Status {@code RESOURCE_EXHAUSTED}: the batching queue is full (reason {@code QUEUE_FULL}; retry with backoff) or the
 * request exceeds a size limit (reason {@code LIMIT_EXCEEDED}, or no reason when the message size limit of gRPC itself
 * was hit).
 */
public class ResourceExhaustedException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  ResourceExhaustedException(ErrorDetails details) {
    super(details);
  }
}
