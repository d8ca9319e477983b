package io.ragsidecar.client;

import io.grpc.Metadata;
import io.grpc.Status;
import java.util.Map;

/**
 * Root of every error the ragsidecar client throws (unchecked).
 *
 * <p>Errors answered by the sidecar carry the gRPC {@linkplain #code() status code}, the stable
 * {@linkplain #reason() reason} of the {@code google.rpc.ErrorInfo} detail (one of the {@code ErrorReason} names of
 * {@code common.proto} without its {@code ERROR_REASON_} prefix, for example {@code "UNKNOWN_MODEL"}), the
 * ErrorInfo's {@linkplain #metadata() metadata}, and the original {@link io.grpc.StatusRuntimeException} as
 * {@linkplain #getCause() cause}. Subclasses name the cases a host usually handles differently; anything else
 * (for example {@code UNIMPLEMENTED} or {@code INTERNAL}) arrives as a plain {@code RagSidecarException}.
 */
public class RagSidecarException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The ErrorInfo domain of every error the sidecar raises. */
  public static final String DOMAIN = "ragsidecar.dev";

  private final transient Status status;
  private final transient Metadata trailers;
  private final String reason;
  private final String domain;
  private final Map<String, String> metadata;

  /** Creates an exception from a status answered by the sidecar (or by the gRPC runtime). */
  protected RagSidecarException(String message, Status status, Metadata trailers, String reason,
      String domain, Map<String, String> metadata, Throwable cause) {
    super(message, cause);
    this.status = status;
    this.trailers = trailers;
    this.reason = reason == null ? "" : reason;
    this.domain = domain == null ? "" : domain;
    this.metadata = metadata == null ? Map.of() : Map.copyOf(metadata);
  }

  RagSidecarException(ErrorDetails details) {
    this(details.message(), details.status(), details.trailers(), details.reason(), details.domain(),
        details.metadata(), details.cause());
  }

  /** The gRPC status code of the call. */
  public Status.Code code() {
    return status.getCode();
  }

  /** The gRPC status of the call (code and description; the cause is this exception's cause). */
  public Status status() {
    return status;
  }

  /**
   * The stable machine-readable reason of the {@code google.rpc.ErrorInfo} detail, for example
   * {@code "UNKNOWN_MODEL"}; empty when the status carried none (errors raised by the gRPC runtime itself, such as a
   * client-side deadline or an unreachable sidecar).
   */
  public String reason() {
    return reason;
  }

  /** The ErrorInfo domain: {@value #DOMAIN} for errors raised by the sidecar; empty when there was no ErrorInfo. */
  public String domain() {
    return domain;
  }

  /** The ErrorInfo metadata (for example {@code model} for an unknown model); empty when there is none. */
  public Map<String, String> metadata() {
    return metadata;
  }

  /** The trailers of the failed call; {@code null} when none were received. */
  public Metadata trailers() {
    return trailers;
  }
}
