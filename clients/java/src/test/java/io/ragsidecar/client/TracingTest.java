package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanContext;
import io.opentelemetry.api.trace.TraceFlags;
import io.opentelemetry.api.trace.TraceState;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.Scope;
import io.ragsidecar.client.Reranker.Document;
import io.ragsidecar.client.Reranker.Request;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * OpenTelemetry: a call made inside the host's span reaches the sidecar with the host's trace id; the sidecar's RPC
 * span (a child of the host's span) and its stage spans arrive at a real OTLP/gRPC receiver (tests/otlp_receiver.py,
 * started here beside a sidecar of its own that exports to it).
 */
class TracingTest {
  private static final String HOST_TRACE = "9f1c3e5a7b2d4f6e8a0c1e3f5a7b9d2c";
  private static final String HOST_SPAN = "2e4a6c8e0b1d3f5a";
  private static final String RPC = "ragsidecar.v1.RerankerService/Rerank";
  private static final List<String> STAGES = List.of("rerank", "tokenize", "queue wait", "inference batch");
  private static final Pattern SPAN = Pattern.compile(
      "\"name\": \"([^\"]*)\", \"trace_id\": \"(\\w+)\", \"span_id\": \"(\\w+)\", \"parent_span_id\": \"(\\w*)\"");

  record Received(String name, String traceId, String spanId, String parentSpanId) {}

  @Test
  void aCallInsideTheHostsSpanContinuesItsTraceWithStageSpansBeneath() throws Exception {
    Process receiver = new ProcessBuilder(Sidecar.executable().resolveSibling("python").toString(),
        Sidecar.repoRoot().resolve("tests/otlp_receiver.py").toString())
        .redirectError(ProcessBuilder.Redirect.INHERIT).start();
    try {
      List<Received> spans = new CopyOnWriteArrayList<>();
      int port = listen(receiver, spans);
      try (Sidecar sidecar = Sidecar.startWithEnvironment(Map.of(
              "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:" + port, "OTEL_BSP_SCHEDULE_DELAY", "100"));
          RagSidecarClient client = sidecar.clientBuilder().intercept(new OpenTelemetryInterceptor()).build()) {
        Span host = Span.wrap(SpanContext.create(HOST_TRACE, HOST_SPAN, TraceFlags.getSampled(),
            TraceState.getDefault()));
        try (Scope scope = Context.current().with(host).makeCurrent()) {
          client.reranker().rerank(Request.builder().query("how do cells divide").documents(List.of(
              Document.of("mitosis", "Mitosis is how a cell divides into two identical cells."),
              Document.of("stocks", "The stock market closed higher today."))).build());
        }
        List<Received> trace = await(spans, mine -> names(mine).containsAll(STAGES) && names(mine).contains(RPC));
        Received rpc = trace.stream().filter(s -> s.name().equals(RPC)).findFirst().orElse(null);
        assertNotNull(rpc, "no RPC span in " + names(trace));
        assertEquals(HOST_SPAN, rpc.parentSpanId());
        for (String stage : STAGES) {
          List<Received> found = trace.stream().filter(s -> s.name().equals(stage)).toList();
          assertFalse(found.isEmpty(), "no " + stage + " span");
          found.forEach(span -> assertBeneath(trace, rpc, span));
        }
      }
    } finally {
      receiver.destroy();
    }
  }

  /** Reads the receiver's port, then collects the spans it prints, on a thread of its own. */
  private static int listen(Process receiver, List<Received> spans) throws IOException {
    BufferedReader lines = new BufferedReader(new InputStreamReader(receiver.getInputStream(), StandardCharsets.UTF_8));
    String first = lines.readLine();
    assertNotNull(first, "the OTLP receiver printed nothing");
    Thread reader = new Thread(() -> {
      try {
        for (String line; (line = lines.readLine()) != null; ) {
          Matcher m = SPAN.matcher(line);
          if (m.find()) {
            spans.add(new Received(m.group(1), m.group(2), m.group(3), m.group(4)));
          }
        }
      } catch (IOException ignored) {
        // the receiver was stopped
      }
    }, "otlp-receiver-output");
    reader.setDaemon(true);
    reader.start();
    return Integer.parseInt(first.substring("port ".length()).trim());
  }

  private static List<Received> await(List<Received> spans, Predicate<List<Received>> done)
      throws InterruptedException {
    long deadline = System.nanoTime() + 60_000_000_000L;
    while (true) {
      List<Received> mine = spans.stream().filter(s -> s.traceId().equals(HOST_TRACE)).toList();
      if (done.test(mine) || System.nanoTime() > deadline) {
        return mine;
      }
      Thread.sleep(100);
    }
  }

  private static List<String> names(List<Received> spans) {
    return spans.stream().map(Received::name).toList();
  }

  private static void assertBeneath(List<Received> trace, Received rpc, Received span) {
    Map<String, Received> byId = new java.util.HashMap<>();
    trace.forEach(s -> byId.put(s.spanId(), s));
    Received at = span;
    while (!at.parentSpanId().equals(rpc.spanId())) {
      at = byId.get(at.parentSpanId());
      assertNotNull(at, span.name() + " is not beneath the RPC span");
    }
  }
}
