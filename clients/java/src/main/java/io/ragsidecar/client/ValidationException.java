package io.ragsidecar.client;

import io.grpc.Status;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.stream.Collectors;

/**
 * Status {@code INVALID_ARGUMENT}: the request is malformed. {@link #violations()} lists one entry per problem, from
 * the {@code google.rpc.BadRequest} detail, each naming the offending field as the sidecar spells it
 * ({@code "query"}, {@code "documents[1].id"}, {@code "top_n"}, ...).
 */
public class ValidationException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  private final List<FieldViolation> violations;

  ValidationException(ErrorDetails details) {
    super(details);
    this.violations = List.copyOf(details.violations());
  }

  /**
   * A request the client refuses before any call (a {@link ChatTurn} that breaks the sidecar's rules): status
   * {@code INVALID_ARGUMENT}, reason {@code INVALID_REQUEST} and the violations the sidecar would report; no trailers,
   * and an empty {@linkplain #domain() domain}, since the sidecar never saw it.
   */
  static ValidationException local(List<FieldViolation> violations) {
    String summary = violations.stream().map(FieldViolation::toString).collect(Collectors.joining("; "));
    return new ValidationException(new ErrorDetails("INVALID_ARGUMENT (INVALID_REQUEST): " + summary,
        Status.INVALID_ARGUMENT.withDescription(summary), null, "INVALID_REQUEST", "", Map.of(), violations, null));
  }

  /** The field violations, in the order the sidecar reported them; empty when it sent none. */
  public List<FieldViolation> violations() {
    return violations;
  }

  /** Whether a violation names exactly this field. */
  public boolean hasViolation(String field) {
    return violations.stream().anyMatch(v -> v.field().equals(field));
  }

  /**
   * One problem with one field of a request.
   *
   * @param field the field path, in the proto's snake_case ({@code "documents[1].id"})
   * @param description what is wrong with it
   */
  public record FieldViolation(String field, String description) {
    public FieldViolation {
      Objects.requireNonNull(field, "field");
      Objects.requireNonNull(description, "description");
    }

    @Override
    public String toString() {
      return field + ": " + description;
    }
  }
}
