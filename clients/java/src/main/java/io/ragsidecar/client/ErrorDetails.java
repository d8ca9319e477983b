package io.ragsidecar.client;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.BadRequest;
import com.google.rpc.ErrorInfo;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.protobuf.StatusProto;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/** What a failed call said: status, trailers and the decoded google.rpc details. Maps it to an exception. */
record ErrorDetails(
    String message,
    Status status,
    Metadata trailers,
    String reason,
    String domain,
    Map<String, String> metadata,
    List<ValidationException.FieldViolation> violations,
    Throwable cause) {

  /** Maps a failure of a gRPC call to the client's exception hierarchy; never returns null. */
  static RagSidecarException toException(Throwable failure) {
    return toException(failure, null);
  }

  /**
   * Maps a failure of a call to the sidecar at {@code target} ({@code host:port} or {@code unix:/path}, named at the
   * end of the message so that an unreachable sidecar's address shows in the host's logs; {@code null} names none).
   */
  static RagSidecarException toException(Throwable failure, String target) {
    if (failure instanceof RagSidecarException already) {
      return already;
    }
    ErrorDetails details = decode(failure, target);
    Status.Code code = details.status().getCode();
    String reason = details.reason();
    switch (code) {
      case INVALID_ARGUMENT:
        return new ValidationException(details);
      case NOT_FOUND:
        if ("UNKNOWN_MODEL".equals(reason)) {
          return new UnknownModelException(details);
        }
        return UnknownBindingException.REASON.equals(reason)
            ? new UnknownBindingException(details)
            : new NotFoundException(details);
      case FAILED_PRECONDITION:
        return "KNOWLEDGE_NOT_READY".equals(reason)
            ? new KnowledgeNotReadyException(details)
            : new FailedPreconditionException(details);
      case PERMISSION_DENIED:
        return new PermissionDeniedException(details);
      case UNAUTHENTICATED:
        return new UnauthenticatedException(details);
      case RESOURCE_EXHAUSTED:
        return new ResourceExhaustedException(details);
      case UNAVAILABLE:
        return "MODEL_NOT_READY".equals(reason) ? new ModelNotReadyException(details) : new UnavailableException(details);
      case DEADLINE_EXCEEDED:
        return new DeadlineExceededException(details);
      default:
        return new RagSidecarException(details);
    }
  }

  static ErrorDetails decode(Throwable failure, String target) {
    Status status = Status.fromThrowable(failure);
    Metadata trailers = Status.trailersFromThrowable(failure);
    String reason = "";
    String domain = "";
    Map<String, String> metadata = Map.of();
    List<ValidationException.FieldViolation> violations = new ArrayList<>();
    com.google.rpc.Status rich = trailers == null ? null : StatusProto.fromStatusAndTrailers(status, trailers);
    if (rich != null) {
      boolean haveInfo = false;
      for (Any detail : rich.getDetailsList()) {
        try {
          if (!haveInfo && detail.is(ErrorInfo.class)) {
            ErrorInfo info = detail.unpack(ErrorInfo.class);
            reason = info.getReason();
            domain = info.getDomain();
            metadata = info.getMetadataMap();
            haveInfo = true;
          } else if (detail.is(BadRequest.class)) {
            for (BadRequest.FieldViolation v : detail.unpack(BadRequest.class).getFieldViolationsList()) {
              violations.add(new ValidationException.FieldViolation(v.getField(), v.getDescription()));
            }
          }
        } catch (InvalidProtocolBufferException malformed) {
          // A detail we cannot decode is ignored; the status code still classifies the error.
        }
      }
    }
    StringBuilder message = new StringBuilder(status.getCode().name());
    if (!reason.isEmpty()) {
      message.append(" (").append(reason).append(')');
    }
    if (status.getDescription() != null && !status.getDescription().isEmpty()) {
      message.append(": ").append(status.getDescription());
    }
    if (target != null) {
      message.append(" [sidecar ").append(target).append(']');
    }
    return new ErrorDetails(message.toString(), status.withCause(null), trailers, reason, domain, metadata,
        List.copyOf(violations), failure);
  }
}
