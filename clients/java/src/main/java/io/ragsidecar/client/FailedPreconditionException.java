package io.ragsidecar.client;

import java.util.Arrays;
import java.util.List;

/**
 * Status {@code FAILED_PRECONDITION}: the sidecar's state, or the knowledge a request names, does not allow the
 * request. {@link #reason()} tells which: {@value #DIRECT_BUDGET_EXCEEDED}, {@value #UNKNOWN_MODEL_WINDOW},
 * {@value #SOURCE_UNREADABLE}, or {@code KNOWLEDGE_NOT_READY} (thrown as {@link KnowledgeNotReadyException}).
 */
public class FailedPreconditionException extends RagSidecarException {
  private static final long serialVersionUID = 1L;

  /** A DIRECT source does not fit its token budget; {@link #sources()} names every one that does not. */
  public static final String DIRECT_BUDGET_EXCEEDED = "DIRECT_BUDGET_EXCEEDED";
  /** The model's input window is unknown and none was given, so a DIRECT budget cannot be sized. */
  public static final String UNKNOWN_MODEL_WINDOW = "UNKNOWN_MODEL_WINDOW";
  /** A knowledge source could not be read or parsed; {@link #sources()} names it. */
  public static final String SOURCE_UNREADABLE = "SOURCE_UNREADABLE";
  /** A configured knowledge source is missing, holds no unit yet, or is unreadable. */
  public static final String KNOWLEDGE_NOT_READY = "KNOWLEDGE_NOT_READY";

  private final List<ValidationException.FieldViolation> violations;

  FailedPreconditionException(ErrorDetails details) {
    super(details);
    this.violations = List.copyOf(details.violations());
  }

  /**
   * The knowledge sources the error is about, from the ErrorInfo metadata {@code "sources"} (comma-separated, in
   * the sidecar's order); empty when it named none.
   */
  public List<String> sources() {
    String sources = metadata().getOrDefault("sources", "");
    return sources.isEmpty() ? List.of() : Arrays.stream(sources.split(",")).map(String::trim).toList();
  }

  /**
   * The field violations of the {@code google.rpc.BadRequest} detail, when the sidecar sent one (for example one
   * {@code "knowledge[<name>]"} entry per failing source of a readiness check); empty otherwise.
   */
  public List<ValidationException.FieldViolation> violations() {
    return violations;
  }
}
