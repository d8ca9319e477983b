package io.ragsidecar.client;

import java.util.Objects;
import java.util.Optional;

/**
 * One model configured on the sidecar, as its last {@code ListModels} answer described it.
 *
 * @param id model identifier, case-sensitive, as named in {@link Reranker.Request#model()}
 * @param kind how the model scores pairs
 * @param maxInputTokens most tokens one model input may hold
 * @param state where the model is in its life cycle
 * @param error why the model failed to load; empty unless {@code state} is {@link State#FAILED}
 * @param isDefault whether the model serves requests that name no model
 * @param longDocumentStrategy the model's default for documents longer than its window; empty when not reported
 */
public record ModelInfo(String id, Kind kind, int maxInputTokens, State state, String error, boolean isDefault,
    Optional<LongDocumentStrategy> longDocumentStrategy) {

  public ModelInfo {
    Objects.requireNonNull(id, "id");
    Objects.requireNonNull(kind, "kind");
    Objects.requireNonNull(state, "state");
    error = error == null ? "" : error;
    longDocumentStrategy = longDocumentStrategy == null ? Optional.empty() : longDocumentStrategy;
  }

  /** How a model scores a (query, document) pair. */
  public enum Kind {
    /** Joint (query, document) input, one logit. */
    CROSS_ENCODER,
    /** Cosine of the pooled query and document vectors. */
    BI_ENCODER,
    /** A kind this client version does not know. */
    UNKNOWN
  }

  /** Where a configured model is in its life cycle. */
  public enum State {
    /** Being loaded or warmed up; requests naming it fail with {@link ModelNotReadyException}. */
    LOADING,
    /** Loaded, warmed up and serving. */
    READY,
    /** Failed to load; see {@link ModelInfo#error()}. */
    FAILED,
    /** A state this client version does not know. */
    UNKNOWN
  }

  static ModelInfo fromProto(io.ragsidecar.v1.ModelInfo proto) {
    Kind kind;
    switch (proto.getKind()) {
      case MODEL_KIND_CROSS_ENCODER:
        kind = Kind.CROSS_ENCODER;
        break;
      case MODEL_KIND_BI_ENCODER:
        kind = Kind.BI_ENCODER;
        break;
      default:
        kind = Kind.UNKNOWN;
    }
    State state;
    switch (proto.getState()) {
      case MODEL_STATE_LOADING:
        state = State.LOADING;
        break;
      case MODEL_STATE_READY:
        state = State.READY;
        break;
      case MODEL_STATE_FAILED:
        state = State.FAILED;
        break;
      default:
        state = State.UNKNOWN;
    }
    return new ModelInfo(proto.getId(), kind, proto.getMaxInputTokens(), state, proto.getError(),
        proto.getIsDefault(), Optional.ofNullable(LongDocumentStrategy.fromProto(proto.getLongDocumentStrategy())));
  }
}
