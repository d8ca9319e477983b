package io.ragsidecar.client;

/**
 * Status {@code PERMISSION_DENIED}: the call carries no principal, or the principal may not use the resource (reason
 * {@value #PERMISSION_DENIED}; for example a chat binding used with another owner id, or in another tenant or session
 * than it was opened in), or a knowledge path resolves outside the sidecar's configured knowledge roots (reason
 * {@value #PATH_OUTSIDE_ROOTS}). Nothing was read.
 */
public class PermissionDeniedException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  /** The call carries no principal, or the principal may not use the resource. */
  public static final String PERMISSION_DENIED = "PERMISSION_DENIED";
  /** A path resolves, after symlinks, outside the configured knowledge roots. */
  public static final String PATH_OUTSIDE_ROOTS = "PATH_OUTSIDE_ROOTS";

  PermissionDeniedException(ErrorDetails details) {
    super(details);
  }

  /** Whether the reason is {@value #PATH_OUTSIDE_ROOTS}. */
  public boolean isPathOutsideRoots() {
    return PATH_OUTSIDE_ROOTS.equals(reason());
  }
}
