package io.ragsidecar.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.Context;
import io.grpc.Deadline;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.EnumMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import java.util.function.Supplier;

/**
 * What every service facade shares: the client's one channel (with its interceptors), the deadlines per
 * {@link CallKind}, the {@link RetryPolicy} and the target. Unary calls go through {@link #call} and
 * {@link #callAsync}, which apply the deadline, repeat what is safe to repeat, and map failures to the
 * {@link RagSidecarException} hierarchy (messages name the target), so a facade for a further service only builds
 * requests and reads responses.
 */
final class ClientContext {
  private final Channel channel;
  private final Map<CallKind, Duration> deadlines;
  private final RetryPolicy retryPolicy;
  private final ScheduledExecutorService scheduler;
  private final String target;

  ClientContext(Channel channel, Map<CallKind, Duration> deadlines, RetryPolicy retryPolicy,
      ScheduledExecutorService scheduler, String target) {
    this.channel = channel;
    this.deadlines = new EnumMap<>(deadlines);
    this.retryPolicy = retryPolicy;
    this.scheduler = scheduler;
    this.target = target;
  }

  Channel channel() {
    return channel;
  }

  /** The deadline of a call of this kind that gives none of its own. */
  Duration deadline(CallKind kind) {
    return deadlines.get(kind);
  }

  /** One deadline for every attempt of a call: the call's own timeout, else its kind's. */
  private Deadline deadlineOf(MethodDescriptor<?, ?> method, Duration timeout) {
    Duration effective = timeout == null ? deadline(CallKind.of(method)) : timeout;
    return Deadline.after(effective.toNanos(), TimeUnit.NANOSECONDS);
  }

  /** Blocking unary call; throws a {@link RagSidecarException} on any failure. */
  <Q, R> R call(MethodDescriptor<Q, R> method, Q request, Duration timeout) {
    Deadline deadline = deadlineOf(method, timeout);
    for (int attempt = 1; ; attempt++) {
      try {
        return ClientCalls.blockingUnaryCall(channel, method, CallOptions.DEFAULT.withDeadline(deadline), request);
      } catch (StatusRuntimeException failure) {
        boolean byCaller = Thread.currentThread().isInterrupted() || Context.current().isCancelled();
        long wait = retryWaitNanos(method, failure, byCaller, attempt, deadline);
        if (wait < 0) {
          throw ErrorDetails.toException(failure, target);
        }
        sleep(wait, failure);
      }
    }
  }

  /**
   * How long to wait before repeating a failed attempt, or -1 when it is not repeated: the method is not safe to
   * repeat, the status is not transient, the attempts are spent, or the wait would reach the deadline.
   * {@code cancelledByCaller}: whether a CANCELLED status is the host's own doing (else the sidecar's).
   */
  private long retryWaitNanos(MethodDescriptor<?, ?> method, Throwable failure, boolean cancelledByCaller,
      int attempt, Deadline deadline) {
    Status.Code code = Status.fromThrowable(failure).getCode();
    if (attempt >= retryPolicy.maxAttempts() || !CallKind.of(method).safeToRepeat()) {
      return -1;
    }
    if (code == Status.Code.CANCELLED && !cancelledByCaller) {
      // A sidecar shutting down cancels the calls that reach it after it stopped taking new ones: gRPC answers
      // them CANCELLED, where it means UNAVAILABLE.
      code = Status.Code.UNAVAILABLE;
    }
    String reason = code == Status.Code.RESOURCE_EXHAUSTED ? ErrorDetails.decode(failure, target).reason() : "";
    if (!RetryPolicy.isTransient(code, reason)) {
      return -1;
    }
    long wait = retryPolicy.backoff(attempt, ThreadLocalRandom.current().nextDouble()).toNanos();
    return wait < deadline.timeRemaining(TimeUnit.NANOSECONDS) ? wait : -1;
  }

  private void sleep(long nanos, StatusRuntimeException failure) {
    try {
      TimeUnit.NANOSECONDS.sleep(nanos);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw ErrorDetails.toException(Status.CANCELLED.withDescription("interrupted while waiting to retry: "
          + failure.getStatus().getDescription()).withCause(e).asRuntimeException(), target);
    }
  }

  /**
   * Asynchronous unary call, repeated as {@link #call} repeats it. The future fails with a {@link RagSidecarException};
   * cancelling it cancels the call (and any retry still to come). Completion happens on the channel's executor.
   */
  <Q, R> CompletableFuture<R> callAsync(MethodDescriptor<Q, R> method, Q request, Duration timeout) {
    CompletableFuture<R> future = new CompletableFuture<>();
    attempt(method, request, deadlineOf(method, timeout), 1, future);
    return future;
  }

  private <Q, R> void attempt(MethodDescriptor<Q, R> method, Q request, Deadline deadline, int attempt,
      CompletableFuture<R> future) {
    if (future.isDone()) {
      return;
    }
    ClientCall<Q, R> call;
    try {
      call = channel.newCall(method, CallOptions.DEFAULT.withDeadline(deadline));
    } catch (RuntimeException failure) {
      future.completeExceptionally(ErrorDetails.toException(failure, target));
      return;
    }
    future.whenComplete((value, failure) -> {
      if (future.isCancelled()) {
        call.cancel("cancelled by the caller", null);
      }
    });
    ClientCalls.asyncUnaryCall(call, request, new StreamObserver<R>() {
      // The answer counts once the call has ended well: a status that follows a message still fails the call.
      private R answer;

      @Override
      public void onNext(R value) {
        answer = value;
      }

      @Override
      public void onError(Throwable failure) {
        long wait = retryWaitNanos(method, failure, future.isCancelled(), attempt, deadline);
        if (wait < 0) {
          future.completeExceptionally(ErrorDetails.toException(failure, target));
          return;
        }
        try {
          scheduler.schedule(() -> attempt(method, request, deadline, attempt + 1, future), wait,
              TimeUnit.NANOSECONDS);
        } catch (RejectedExecutionException closed) {
          future.completeExceptionally(ErrorDetails.toException(failure, target));
        }
      }

      @Override
      public void onCompleted() {
        // A unary call that completes without a message fails in onError instead.
        future.complete(answer);
      }
    });
  }

  /**
   * Asynchronous unary call of a request built by {@code request} (a failure building it fails the future), its
   * response converted by {@code convert}. Cancelling the returned future cancels the call.
   */
  <Q, R, T> CompletableFuture<T> callAsync(MethodDescriptor<Q, R> method, Supplier<Q> request, Duration timeout,
      Function<R, T> convert) {
    Q proto;
    try {
      proto = request.get();
    } catch (RuntimeException invalid) {
      return CompletableFuture.failedFuture(invalid);
    }
    CompletableFuture<R> call = callAsync(method, proto, timeout);
    CompletableFuture<T> result = call.thenApply(convert);
    result.whenComplete((value, failure) -> {
      if (result.isCancelled()) {
        call.cancel(false);
      }
    });
    return result;
  }
}
