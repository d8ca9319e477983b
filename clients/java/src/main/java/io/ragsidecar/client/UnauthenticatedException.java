package io.ragsidecar.client;

/**
 * Status {@code UNAUTHENTICATED}: the bearer token is missing or wrong (reason {@code UNAUTHENTICATED}). Configure it
 * with {@link RagSidecarClient.Builder#bearerToken(String)}.
 */
public class UnauthenticatedException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  UnauthenticatedException(ErrorDetails details) {
    super(details);
  }
}
