package io.ragsidecar.client;

/**
 * Status {@code NOT_FOUND} with reason {@value #REASON}: the chat binding id is not open on the sidecar. Bindings live
 * in the sidecar's memory, so this is what every binding id gives after the binding was closed or the sidecar
 * restarted; the host opens the binding again (and appends its documents again).
 */
public class UnknownBindingException extends NotFoundException {
  private static final long serialVersionUID = 1L;

  /** The ErrorInfo reason of this exception. */
  public static final String REASON = "UNKNOWN_BINDING";

  UnknownBindingException(ErrorDetails details) {
    super(details);
  }

  /** The binding id the sidecar did not know (from the ErrorInfo metadata); empty when not given. */
  public String bindingId() {
    return metadata().getOrDefault("binding_id", "");
  }
}
