package io.ragsidecar.client;

/**
 * Status {@code DEADLINE_EXCEEDED}: the call's deadline passed, on the client or on the sidecar (reason
 * {@code DEADLINE_EXCEEDED} when the sidecar noticed first). See {@link RagSidecarClient.Builder#defaultDeadline}.
 */
public class DeadlineExceededException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  DeadlineExceededException(ErrorDetails details) {
    super(details);
  }
}
