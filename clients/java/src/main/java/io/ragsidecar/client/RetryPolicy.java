package io.ragsidecar.client;

import io.grpc.Status;
import java.time.Duration;
import java.util.Objects;

/**
 * How the client repeats a call that is safe to repeat ({@link CallKind#safeToRepeat()}) after a transient failure:
 * {@code UNAVAILABLE} (the sidecar is restarting, warming up, or a model or the store is not ready), or
 * {@code RESOURCE_EXHAUSTED} with reason {@code QUEUE_FULL} (refused before any work ran), or {@code CANCELLED} by the
 * sidecar rather than the host (a sidecar shutting down cancels late calls). Each wait is exponential
 * backoff with jitter; the attempts are bounded, and the call's deadline bounds them all together. Immutable.
 *
 * <p>Defaults, the same as the TypeScript client's: 5 attempts, 250 ms first backoff, x2 per attempt, at most 5 s,
 * jitter 0.2. {@link #none()} never retries. See docs/clients.md.
 */
public final class RetryPolicy {
  private static final RetryPolicy DEFAULTS = builder().build();
  private static final RetryPolicy NONE = builder().maxAttempts(1).build();

  private final int maxAttempts;
  private final Duration initialBackoff;
  private final Duration maxBackoff;
  private final double backoffMultiplier;
  private final double jitter;

  private RetryPolicy(Builder b) {
    maxAttempts = b.maxAttempts;
    initialBackoff = b.initialBackoff;
    maxBackoff = b.maxBackoff;
    backoffMultiplier = b.backoffMultiplier;
    jitter = b.jitter;
  }

  /** The default policy. */
  public static RetryPolicy defaults() {
    return DEFAULTS;
  }

  /** A policy that never retries: every call is made once. */
  public static RetryPolicy none() {
    return NONE;
  }

  public static Builder builder() {
    return new Builder();
  }

  /** Attempts of one call, the first included. */
  public int maxAttempts() {
    return maxAttempts;
  }

  /** Whether a failed attempt with this status and ErrorInfo reason is worth repeating (the call permitting). */
  public static boolean isTransient(Status.Code code, String reason) {
    return code == Status.Code.UNAVAILABLE
        || code == Status.Code.RESOURCE_EXHAUSTED && "QUEUE_FULL".equals(reason);
  }

  /**
   * The wait before attempt {@code failedAttempts + 1}: the backoff grown {@code failedAttempts - 1} times, capped,
   * then scaled by {@code 1 + jitter * (2 * random - 1)} for a {@code random} in [0, 1).
   */
  public Duration backoff(int failedAttempts, double random) {
    double nanos = initialBackoff.toNanos() * Math.pow(backoffMultiplier, failedAttempts - 1);
    nanos = Math.min(nanos, maxBackoff.toNanos()) * (1 + jitter * (2 * random - 1));
    return Duration.ofNanos((long) nanos);
  }

  @Override
  public String toString() {
    return "RetryPolicy[maxAttempts=" + maxAttempts + ", initialBackoff=" + initialBackoff + ", maxBackoff="
        + maxBackoff + ", backoffMultiplier=" + backoffMultiplier + ", jitter=" + jitter + "]";
  }

  /** Configures a {@link RetryPolicy}; every setting starts at its default. */
  public static final class Builder {
    private int maxAttempts = 5;
    private Duration initialBackoff = Duration.ofMillis(250);
    private Duration maxBackoff = Duration.ofSeconds(5);
    private double backoffMultiplier = 2.0;
    private double jitter = 0.2;

    private Builder() {}

    /** Attempts of one call, the first included (default 5); 1 never retries. */
    public Builder maxAttempts(int attempts) {
      if (attempts < 1) {
        throw new IllegalArgumentException("maxAttempts must be at least 1: " + attempts);
      }
      this.maxAttempts = attempts;
      return this;
    }

    /** The wait after the first failed attempt (default 250 ms). */
    public Builder initialBackoff(Duration backoff) {
      this.initialBackoff = positive(backoff, "initialBackoff");
      return this;
    }

    /** The longest wait between two attempts (default 5 s). */
    public Builder maxBackoff(Duration backoff) {
      this.maxBackoff = positive(backoff, "maxBackoff");
      return this;
    }

    /** How much each wait grows over the previous one (default 2). */
    public Builder backoffMultiplier(double multiplier) {
      if (!(multiplier >= 1)) {
        throw new IllegalArgumentException("backoffMultiplier must be at least 1: " + multiplier);
      }
      this.backoffMultiplier = multiplier;
      return this;
    }

    /** Each wait is scaled by a random factor in [1 - jitter, 1 + jitter] (default 0.2), so clients spread out. */
    public Builder jitter(double jitter) {
      if (!(jitter >= 0 && jitter <= 1)) {
        throw new IllegalArgumentException("jitter must be in [0, 1]: " + jitter);
      }
      this.jitter = jitter;
      return this;
    }

    public RetryPolicy build() {
      if (maxBackoff.compareTo(initialBackoff) < 0) {
        throw new IllegalArgumentException("maxBackoff " + maxBackoff + " is below initialBackoff " + initialBackoff);
      }
      return new RetryPolicy(this);
    }

    private static Duration positive(Duration value, String name) {
      Objects.requireNonNull(value, name);
      if (value.isNegative() || value.isZero()) {
        throw new IllegalArgumentException(name + " must be positive: " + value);
      }
      return value;
    }
  }
}
