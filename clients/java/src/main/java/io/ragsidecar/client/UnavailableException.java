package io.ragsidecar.client;

/**
 * Status {@code UNAVAILABLE}: the sidecar cannot be reached, is shutting down, or the named model is not loaded yet
 * (see {@link ModelNotReadyException}). Usually transient.
 */
public class UnavailableException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  UnavailableException(ErrorDetails details) {
    super(details);
  }
}
