package io.ragsidecar.client;

/**
 * Status {@code NOT_FOUND} with reason {@code UNKNOWN_MODEL}: the named model is not configured on the sidecar.
 * Model identifiers are case-sensitive.
 */
public class UnknownModelException extends NotFoundException {
  private static final long serialVersionUID = 1L;

  UnknownModelException(ErrorDetails details) {
    super(details);
  }

  /** The model identifier the sidecar did not know (from the ErrorInfo metadata); empty when not given. */
  public String model() {
    return metadata().getOrDefault("model", "");
  }
}
