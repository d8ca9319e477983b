package io.ragsidecar.client;

/**
 * Status {@code UNAVAILABLE}: the sidecar cannot be reached, is shutting down, the named model is not loaded yet
 * (see {@link ModelNotReadyException}), or the shared store's database is unreachable (reason
 * {@code STORE_UNAVAILABLE}). Usually transient: retry with backoff.
 */
public class UnavailableException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  UnavailableException(ErrorDetails details) {
    super(details);
  }
}
