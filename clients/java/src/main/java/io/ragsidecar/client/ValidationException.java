package io.ragsidecar.client;

import java.util.List;
import java.util.Objects;

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
