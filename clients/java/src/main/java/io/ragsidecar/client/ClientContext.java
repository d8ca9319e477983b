package io.ragsidecar.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.MethodDescriptor;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import java.util.function.Supplier;

/**
 * What every service facade shares: the client's one channel (with its interceptors), the default deadline and the
 * target. Unary calls go through {@link #call} and {@link #callAsync}, which apply the deadline and map failures to
 * the {@link RagSidecarException} hierarchy (messages name the target), so a facade for a further service only builds
 * requests and reads responses.
 */
final class ClientContext {
  private final Channel channel;
  private final Duration defaultDeadline;
  private final String target;

  ClientContext(Channel channel, Duration defaultDeadline, String target) {
    this.channel = channel;
    this.defaultDeadline = defaultDeadline;
    this.target = target;
  }

  Channel channel() {
    return channel;
  }

  Duration defaultDeadline() {
    return defaultDeadline;
  }

  CallOptions callOptions(Duration timeout) {
    Duration effective = timeout == null ? defaultDeadline : timeout;
    return CallOptions.DEFAULT.withDeadlineAfter(effective.toNanos(), TimeUnit.NANOSECONDS);
  }

  /** Blocking unary call; throws a {@link RagSidecarException} on any failure. */
  <Q, R> R call(MethodDescriptor<Q, R> method, Q request, Duration timeout) {
    try {
      return ClientCalls.blockingUnaryCall(channel, method, callOptions(timeout), request);
    } catch (StatusRuntimeException failure) {
      throw ErrorDetails.toException(failure, target);
    }
  }

  /**
   * Asynchronous unary call. The future fails with a {@link RagSidecarException}; cancelling it cancels the call.
   * Completion happens on the channel's executor.
   */
  <Q, R> CompletableFuture<R> callAsync(MethodDescriptor<Q, R> method, Q request, Duration timeout) {
    CompletableFuture<R> future = new CompletableFuture<>();
    ClientCall<Q, R> call;
    try {
      call = channel.newCall(method, callOptions(timeout));
    } catch (RuntimeException failure) {
      future.completeExceptionally(ErrorDetails.toException(failure, target));
      return future;
    }
    future.whenComplete((value, failure) -> {
      if (future.isCancelled()) {
        call.cancel("cancelled by the caller", null);
      }
    });
    ClientCalls.asyncUnaryCall(call, request, new StreamObserver<R>() {
      @Override
      public void onNext(R value) {
        future.complete(value);
      }

      @Override
      public void onError(Throwable failure) {
        future.completeExceptionally(ErrorDetails.toException(failure, target));
      }

      @Override
      public void onCompleted() {
        // The value arrived in onNext; a unary call that completes without one fails in onError instead.
      }
    });
    return future;
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
