package io.ragsidecar.client;

/**
 * Status {@code UNAVAILABLE} with reason {@code MODEL_NOT_READY}: the model is configured but still loading, or failed to
 * load. {@link #metadata()} names it under {@code model}.
 */
public class ModelNotReadyException extends UnavailableException {
  private static final long serialVersionUID = 1L;

  ModelNotReadyException(ErrorDetails details) {
    super(details);
  }
}
