package io.ragsidecar.client;

/**
 * Status {@code NOT_FOUND}: the request names something the sidecar does not have. See {@link UnknownModelException}
 * and {@link UnknownBindingException}.
 */
public class NotFoundException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  NotFoundException(ErrorDetails details) {
    super(details);
  }
}
