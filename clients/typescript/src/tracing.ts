// OpenTelemetry context propagation: a Connect interceptor that sends the host's current span to the sidecar as the
// W3C `traceparent` (and `tracestate`) of each call, so the sidecar's spans join the host's trace. A subpath of its
// own (`@ragsidecar/client/tracing`): only hosts that import it need @opentelemetry/api, an optional peer dependency.
import type { Interceptor } from "@connectrpc/connect";
import { TraceFlags, context, isSpanContextValid, trace } from "@opentelemetry/api";

/**
 * Sends the span current where a call is made (the host's OpenTelemetry context) as its W3C trace context. The
 * sidecar reads W3C trace context only, whatever propagators the host has registered; without an active span
 * (or without an OpenTelemetry SDK) nothing is sent.
 */
export function openTelemetryInterceptor(): Interceptor {
  return (next) => async (request) => {
    const span = trace.getSpanContext(context.active());
    if (span !== undefined && isSpanContextValid(span)) {
      const sampled = (span.traceFlags & TraceFlags.SAMPLED) === TraceFlags.SAMPLED;
      request.header.set("traceparent", `00-${span.traceId}-${span.spanId}-${sampled ? "01" : "00"}`);
      const state = span.traceState?.serialize();
      if (state) request.header.set("tracestate", state);
    }
    return next(request);
  };
}
