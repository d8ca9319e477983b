package io.ragsidecar.client;

import java.util.List;
import java.util.Objects;
import io.ragsidecar.v1.ValidateConfigurationResponse;

/**
 * What {@link SidecarRetrieval#validateConfiguration} found. Configuration problems are not errors: the sidecar
 * reports every one of them at once, so a host can show them together.
 *
 * @param valid true exactly when {@code violations} is empty
 * @param violations every problem, in request field order
 */
public record ConfigurationValidation(boolean valid, List<Violation> violations) {

  public ConfigurationValidation {
    violations = List.copyOf(violations);
  }

  static ConfigurationValidation fromProto(ValidateConfigurationResponse response) {
    return new ConfigurationValidation(response.getValid(),
        response.getViolationsList().stream().map(Violation::fromProto).toList());
  }

  /** Whether a violation names exactly this field (for example {@code "target.knowledge[2].max_tokens"}). */
  public boolean hasViolation(String field) {
    return violations.stream().anyMatch(v -> v.field().equals(field));
  }

  /** The violations with this reason (for example {@code "PATH_OUTSIDE_ROOTS"}), in order. */
  public List<Violation> withReason(String reason) {
    return violations.stream().filter(v -> v.reason().equals(reason)).toList();
  }

  /**
   * Throws an {@link IllegalStateException} listing every violation unless valid: for hosts whose
   * {@code validateConfiguration} must fail at agent init.
   */
  public ConfigurationValidation orThrow() {
    if (!valid) {
      throw new IllegalStateException("invalid knowledge configuration: " + violations);
    }
    return this;
  }

  /**
   * One configuration problem.
   *
   * @param field path of the offending request field, in proto field names with list indexes and map keys
   *     ({@code "target.knowledge[2].max_tokens"}, {@code "outer[0].path"}, {@code "target.actions[0].knowledge[1]"})
   * @param reason stable reason without the {@code ERROR_REASON_} prefix: {@code INVALID_CONFIGURATION},
   *     {@code UNKNOWN_KNOWLEDGE}, {@code DIRECT_BUDGET_EXCEEDED}, {@code UNKNOWN_MODEL_WINDOW},
   *     {@code PATH_OUTSIDE_ROOTS}, {@code SOURCE_UNREADABLE}, {@code UNKNOWN_MODEL}
   * @param description human-readable explanation; not a stable string
   */
  public record Violation(String field, String reason, String description) {
    public Violation {
      Objects.requireNonNull(field, "field");
      Objects.requireNonNull(reason, "reason");
      Objects.requireNonNull(description, "description");
    }

    static Violation fromProto(io.ragsidecar.v1.Violation v) {
      return new Violation(v.getField(), reasonName(v.getReasonValue()), v.getDescription());
    }

    static String reasonName(int value) {
      io.ragsidecar.v1.ErrorReason reason = io.ragsidecar.v1.ErrorReason.forNumber(value);
      if (reason == null) {
        return "ERROR_REASON_" + value;
      }
      String name = reason.name();
      return name.startsWith("ERROR_REASON_") ? name.substring("ERROR_REASON_".length()) : name;
    }

    @Override
    public String toString() {
      return field + " (" + reason + "): " + description;
    }
  }
}
