package io.ragsidecar.client;

import io.grpc.MethodDescriptor;
import io.grpc.health.v1.HealthGrpc;
import io.ragsidecar.v1.RerankerServiceGrpc;
import java.time.Duration;

/**
 * What a call does, which decides its default deadline and whether the client may repeat it (docs/clients.md, "Calls
 * the clients retry"). The rule lives in the protos: a method whose {@code idempotency_level} is
 * {@code NO_SIDE_EFFECTS} or {@code IDEMPOTENT} is safe to repeat (the generated {@link MethodDescriptor} says so);
 * the standard health check is too.
 */
public enum CallKind {
  /** Health checks and {@code ListModels}: cheap reads a host makes to learn whether the sidecar is there. */
  PROBE(Duration.ofSeconds(5)),
  /** Every other call that is safe to repeat: {@code Rerank}, {@code Search} and the read-only retrieval calls. */
  READ(Duration.ofSeconds(30)),
  /** Every call that is not safe to repeat (writes, and calls that move a SEQUENTIAL cursor): never retried. */
  WRITE(Duration.ofSeconds(60));

  private final Duration defaultDeadline;

  CallKind(Duration defaultDeadline) {
    this.defaultDeadline = defaultDeadline;
  }

  /** The deadline of a call of this kind that gives none, unless the client's builder set another. */
  public Duration defaultDeadline() {
    return defaultDeadline;
  }

  /** Whether the client's retry policy may repeat a call of this kind. */
  public boolean safeToRepeat() {
    return this != WRITE;
  }

  /** The kind of a method, read from its proto descriptor. */
  public static CallKind of(MethodDescriptor<?, ?> method) {
    String name = method.getFullMethodName();
    if (name.equals(HealthGrpc.getCheckMethod().getFullMethodName())
        || name.equals(RerankerServiceGrpc.getListModelsMethod().getFullMethodName())) {
      return PROBE;
    }
    // grpc-java's code generator marks NO_SIDE_EFFECTS methods safe and IDEMPOTENT ones idempotent.
    return method.isSafe() || method.isIdempotent() ? READ : WRITE;
  }
}
