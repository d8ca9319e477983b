package io.ragsidecar.client;

import static io.ragsidecar.client.RetrievalRequests.document;
import static io.ragsidecar.client.RetrievalRequests.memory;
import static io.ragsidecar.client.RetrievalRequests.target;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.MethodDescriptor;
import io.grpc.ServiceDescriptor;
import io.grpc.Status;
import io.grpc.health.v1.HealthGrpc;
import io.ragsidecar.v1.ChatKnowledgeServiceGrpc;
import io.ragsidecar.v1.KnowledgeEntry;
import io.ragsidecar.v1.KnowledgeUse;
import io.ragsidecar.v1.MemoryDocument;
import io.ragsidecar.v1.RerankerServiceGrpc;
import io.ragsidecar.v1.RetrievalServiceGrpc;
import io.ragsidecar.v1.SearchRequest;
import java.nio.file.Files;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/** The retry policy: which calls it repeats, its backoff, and a sidecar restarted while a host keeps calling. */
class RetryTest {
  private static final KnowledgeScope SCOPE = new KnowledgeScope("agent-host", "acme", "restart");
  private static final KnowledgeEntry NOTES = memory("notes", KnowledgeUse.KNOWLEDGE_USE_SEARCH).build();
  private static final List<MemoryDocument> DOCS = List.of(document("n1", "Bob prefers delivery on Saturdays."));

  @Test
  void theRetriedCallsAreTheDocumentedOnes() throws Exception {
    Set<String> retried = new TreeSet<>();
    for (ServiceDescriptor service : List.of(RerankerServiceGrpc.getServiceDescriptor(),
        RetrievalServiceGrpc.getServiceDescriptor(), ChatKnowledgeServiceGrpc.getServiceDescriptor(),
        HealthGrpc.getServiceDescriptor())) {
      for (MethodDescriptor<?, ?> method : service.getMethods()) {
        if (CallKind.of(method).safeToRepeat()) {
          retried.add(method.getFullMethodName());
        }
      }
    }
    String doc = Files.readString(Sidecar.repoRoot().resolve("docs/clients.md"));
    String table = doc.split("## Calls the clients retry", 2)[1].split("\n## ", 2)[0];
    Set<String> documented = new TreeSet<>();
    Matcher row = Pattern.compile("(?m)^\\| `([\\w.]+/\\w+)` \\|").matcher(table);
    while (row.find()) {
      documented.add(row.group(1));
    }
    assertEquals(documented, retried);
    assertEquals(CallKind.PROBE, CallKind.of(HealthGrpc.getCheckMethod()));
    assertEquals(CallKind.READ, CallKind.of(RetrievalServiceGrpc.getSearchMethod()));
    assertEquals(CallKind.WRITE, CallKind.of(RetrievalServiceGrpc.getEnforceMethod()));
  }

  @Test
  void backoffGrowsToItsCapWithinTheJitter() {
    RetryPolicy policy = RetryPolicy.defaults();
    assertEquals(5, policy.maxAttempts());
    assertEquals(List.of(250L, 500L, 1000L, 2000L, 4000L, 5000L), java.util.stream.IntStream.rangeClosed(1, 6)
        .mapToObj(n -> policy.backoff(n, 0.5).toMillis()).toList());
    assertEquals(200, policy.backoff(1, 0).toMillis());
    assertEquals(300, policy.backoff(1, 1).toMillis());
    assertEquals(1, RetryPolicy.none().maxAttempts());
    assertThrows(IllegalArgumentException.class, () -> RetryPolicy.builder().jitter(1.5));
    assertTrue(RetryPolicy.isTransient(Status.Code.UNAVAILABLE, "WARMING_UP"));
    assertTrue(RetryPolicy.isTransient(Status.Code.RESOURCE_EXHAUSTED, "QUEUE_FULL"));
    assertFalse(RetryPolicy.isTransient(Status.Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED"));
    assertFalse(RetryPolicy.isTransient(Status.Code.DEADLINE_EXCEEDED, ""));
  }

  @Test
  void callsSucceedThroughARestartAndWritesAreNotRepeated() throws Exception {
    int port = ConnectionTest.freePort();
    Map<String, AtomicInteger> attempts = new ConcurrentHashMap<>();
    ClientInterceptor counting = new ClientInterceptor() {
      @Override
      public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
        attempts.computeIfAbsent(method.getBareMethodName(), k -> new AtomicInteger()).incrementAndGet();
        return next.newCall(method, options);
      }
    };
    // Patient enough for a sidecar that takes a while to start on a busy machine.
    RetryPolicy patient = RetryPolicy.builder().maxAttempts(200).initialBackoff(Duration.ofMillis(100))
        .maxBackoff(Duration.ofMillis(500)).build();
    Sidecar first = Sidecar.startOnPort(port, true);
    try (RagSidecarClient client = RagSidecarClient.builder().host("127.0.0.1").port(port).retryPolicy(patient)
        .deadline(CallKind.READ, Duration.ofSeconds(180)).intercept(counting).build()) {
      SidecarRetrieval scoped = client.retrieval().withScope(SCOPE);
      SearchRequest search = SearchRequest.newBuilder().setTarget(target("agent", List.of(NOTES)))
          .setQuery("when does Bob want his delivery?").build();
      assertEquals(1, scoped.upsertDocuments("notes", DOCS).inserted());

      // A host that keeps reranking: every call succeeds, before, during and after the restart.
      AtomicBoolean keepCalling = new AtomicBoolean(true);
      List<Throwable> failures = new CopyOnWriteArrayList<>();
      AtomicInteger answered = new AtomicInteger();
      Thread host = new Thread(() -> {
        while (keepCalling.get()) {
          try {
            assertEquals("paris", client.reranker().rerank(RerankerTest.france()).get(0).id());
            answered.incrementAndGet();
          } catch (Throwable failure) {
            failures.add(failure);
          }
        }
      }, "host");
      host.start();
      while (answered.get() < 3) {
        Thread.sleep(20);
      }
      first.close();
      int rerankBefore = attempts.get("Rerank").get();
      // A write while the sidecar is down fails at once: it may have been applied, so it is never repeated.
      assertThrows(UnavailableException.class, () -> scoped.upsertDocuments("notes", DOCS));
      assertEquals(2, attempts.get("UpsertDocuments").get());
      CompletableFuture<SearchResult> searched = scoped.searchAsync(search);
      try (Sidecar second = Sidecar.startOnPort(port, true)) {
        searched.get(180, TimeUnit.SECONDS);  // answered by the second sidecar (its own, empty, knowledge)
        int answeredAfterRestart = answered.get();
        while (answered.get() < answeredAfterRestart + 3) {
          Thread.sleep(20);
        }
        keepCalling.set(false);
        host.join(60_000);
        assertEquals(List.of(), failures);
        assertTrue(attempts.get("Rerank").get() > answered.get(), "no Rerank was repeated: " + attempts);
        assertTrue(attempts.get("Search").get() > 1, "the Search was not repeated: " + attempts);
        assertEquals(2, attempts.get("UpsertDocuments").get());
        assertEquals(1, scoped.upsertDocuments("notes", DOCS).inserted());
        assertTrue(rerankBefore > 0);
        assertFalse(host.isAlive());
      }
    } finally {
      first.close();
    }
  }
}
