package io.ragsidecar.client;

/**
 * Status {@code PERMISSION_DENIED}: the caller's principal may not use the resource, or a path lies outside the configured
 * knowledge roots (reasons {@code PERMISSION_DENIED}, {@code PATH_OUTSIDE_ROOTS}).
 */
public class PermissionDeniedException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  PermissionDeniedException(ErrorDetails details) {
    super(details);
  }
}
