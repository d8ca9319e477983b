package io.ragsidecar.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.opentelemetry.api.trace.propagation.W3CTraceContextPropagator;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.propagation.TextMapSetter;

/**
 * Sends the host's current OpenTelemetry context to the sidecar as each call's W3C {@code traceparent} (and
 * {@code tracestate}), so that the sidecar's spans join the host's trace:
 * {@code RagSidecarClient.builder().intercept(new OpenTelemetryInterceptor())}.
 *
 * <p>The context is the one current on the thread that makes the call (for asynchronous calls, the thread that
 * starts them). The sidecar reads W3C trace context only, so this writes it whatever propagators the host's SDK
 * has registered. It needs {@code io.opentelemetry:opentelemetry-api} on the class path, an optional dependency of
 * this client: a host that does not trace never loads this class. Thread-safe; one instance serves every call.
 */
public final class OpenTelemetryInterceptor implements ClientInterceptor {
  private static final TextMapSetter<Metadata> HEADERS =
      (headers, key, value) -> headers.put(Metadata.Key.of(key, Metadata.ASCII_STRING_MARSHALLER), value);

  @Override
  public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
    Context caller = Context.current();
    return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
      @Override
      public void start(Listener<R> listener, Metadata headers) {
        W3CTraceContextPropagator.getInstance().inject(caller, headers, HEADERS);
        super.start(listener, headers);
      }
    };
  }
}
