package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.ragsidecar.client.SidecarExtension.Options;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.ServerSocket;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** Readiness at build time, the host's interceptors and channel settings, and errors that name the sidecar. */
@ExtendWith(SidecarExtension.class)
class ConnectionTest {
  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  /** A loopback port nothing listens on (yet). */
  static int freePort() {
    try (ServerSocket socket = new ServerSocket(0)) {
      return socket.getLocalPort();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  static RagSidecarClient.Builder toPort(int port) {
    return RagSidecarClient.builder().host("127.0.0.1").port(port);
  }

  @Test
  void buildWaitsForASidecarStartedAfterTheClient() throws Exception {
    int port = freePort();
    try (RagSidecarClient early = toPort(port).build()) {
      CompletableFuture<RagSidecarClient> waiting =
          CompletableFuture.supplyAsync(() -> toPort(port).awaitReady(Duration.ofSeconds(180)).build());
      UnavailableException down = assertThrows(UnavailableException.class, () -> early.reranker().refreshModels());
      assertTrue(down.getMessage().contains("127.0.0.1:" + port), down.getMessage());
      assertFalse(early.reranker().supports(RerankerTest.CROSS_ENCODER));
      assertFalse(waiting.isDone(), "build() returned before the sidecar started");

      try (Sidecar late = Sidecar.startOnPort(port);
          RagSidecarClient ready = waiting.get(180, TimeUnit.SECONDS)) {
        // Right after build(): the snapshot is there, no waiting in the host.
        assertTrue(ready.reranker().supports(RerankerTest.CROSS_ENCODER));
        assertEquals(ModelInfo.State.READY,
            ready.reranker().models().orElseThrow().defaultModel().orElseThrow().state());
        assertEquals("paris", ready.reranker().rerank(RerankerTest.france()).get(0).id());
        // The client built before the sidecar notices it too (its reconnect back-off is cut short).
        ModelSnapshot seen = early.awaitReady(Duration.ofSeconds(60));
        assertTrue(seen.supports(RerankerTest.CROSS_ENCODER));
        assertTrue(early.reranker().supports(RerankerTest.CROSS_ENCODER));
        assertEquals(port, late.port());
      }
    }
  }

  @Test
  void awaitReadyTimesOutNamingTheTarget() {
    int port = freePort();
    RagSidecarClient.Builder builder = toPort(port).awaitReady(Duration.ofMillis(1500));
    DeadlineExceededException e = assertThrows(DeadlineExceededException.class, builder::build);
    assertEquals(Status.Code.DEADLINE_EXCEEDED, e.code());
    assertTrue(e.getMessage().contains("127.0.0.1:" + port), e.getMessage());
    assertTrue(e.getMessage().contains("not ready within PT1.5S"), e.getMessage());
  }

  @Test
  void awaitReadyFailsAtOnceWhenTheSidecarRefusesListModels(@Options(token = AuthTest.TOKEN) Sidecar sidecar) {
    RagSidecarClient.Builder wrongToken =
        sidecar.clientBuilder().bearerToken("wrong").awaitReady(Duration.ofSeconds(60));
    UnauthenticatedException e = assertThrows(UnauthenticatedException.class, wrongToken::build);
    assertTrue(e.getMessage().contains("[sidecar 127.0.0.1:" + sidecar.port() + "]"), e.getMessage());
  }

  @Test
  void anUnreachableSidecarIsNamedInEveryError() throws Exception {
    int port = freePort();
    try (RagSidecarClient client = toPort(port).build()) {
      UnavailableException blocking = assertThrows(UnavailableException.class,
          () -> client.reranker().rerank(RerankerTest.france()));
      assertTrue(blocking.getMessage().contains("[sidecar 127.0.0.1:" + port + "]"), blocking.getMessage());
      Throwable async = assertThrows(java.util.concurrent.ExecutionException.class,
          () -> client.reranker().rerankAsync(RerankerTest.france()).get(30, TimeUnit.SECONDS)).getCause();
      assertTrue(async instanceof UnavailableException, String.valueOf(async));
      assertTrue(async.getMessage().contains("[sidecar 127.0.0.1:" + port + "]"), async.getMessage());
    }
  }

  /** Logs, per call, its name when asked for the call, and whether the headers it starts with carry the token. */
  static final class Recorder implements ClientInterceptor {
    private final String name;
    private final List<String> log;

    Recorder(String name, List<String> log) {
      this.name = name;
      this.log = log;
    }

    @Override
    public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
      String call = name + " " + method.getFullMethodName();
      log.add(call);
      return new ForwardingClientCall.SimpleForwardingClientCall<Q, R>(next.newCall(method, options)) {
        @Override
        public void start(Listener<R> listener, Metadata headers) {
          log.add(call + (headers.containsKey(AUTHORIZATION) ? " starts with the token" : " starts without"));
          super.start(listener, headers);
        }
      };
    }
  }

  @Test
  void interceptorsRunInTheGivenOrderAfterTheToken(@Options(token = AuthTest.TOKEN) Sidecar sidecar) {
    List<String> log = new CopyOnWriteArrayList<>();
    try (RagSidecarClient client = sidecar.clientBuilder().bearerToken(AuthTest.TOKEN)
        .intercept(new Recorder("a", log), new Recorder("b", log)).intercept(new Recorder("c", log))
        .awaitReady(Duration.ofSeconds(60)).build()) {
      assertTrue(log.contains("a grpc.health.v1.Health/Check"), log.toString());
      assertTrue(log.contains("a ragsidecar.v1.RerankerService/ListModels starts with the token"), log.toString());
      log.clear();
      assertEquals("paris", client.reranker().rerank(RerankerTest.france()).get(0).id());
      String rerank = " ragsidecar.v1.RerankerService/Rerank";
      assertEquals(List.of("a" + rerank, "b" + rerank, "c" + rerank, "a" + rerank + " starts with the token",
          "b" + rerank + " starts with the token", "c" + rerank + " starts with the token"),
          log.stream().filter(entry -> entry.contains("/Rerank")).toList());
    }
  }

  @Test
  void theChannelCustomizerRunsAfterTheClientsOwnSettings(Sidecar sidecar) {
    List<String> customized = new CopyOnWriteArrayList<>();
    try (RagSidecarClient client = sidecar.clientBuilder().maxInboundMessageSize(64 << 20)
        .channelCustomizer(builder -> {
          customized.add(builder.getClass().getSimpleName());
          builder.maxInboundMessageSize(16);   // overrides the client's own limit: every answer is too large
        }).build()) {
      assertEquals(List.of("NettyChannelBuilder"), customized);
      RagSidecarException e = assertThrows(RagSidecarException.class,
          () -> client.reranker().rerank(RerankerTest.france()));
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, e.code());
      assertTrue(e.getMessage().contains("[sidecar 127.0.0.1:" + sidecar.port() + "]"), e.getMessage());
    }
  }
}
