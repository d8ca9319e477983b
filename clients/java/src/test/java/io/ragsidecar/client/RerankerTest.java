package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.ragsidecar.client.Reranker.Document;
import io.ragsidecar.client.Reranker.RankedDocument;
import io.ragsidecar.client.Reranker.Request;
import java.net.ServerSocket;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** The reranker facade against the real sidecar and its real models. */
@ExtendWith(SidecarExtension.class)
class RerankerTest {
  static final String CROSS_ENCODER = "ms-marco-MiniLM-L-12-v2";
  static final String BI_ENCODER = "bge-small-en-v1.5";

  static final List<Document> FRANCE = List.of(
      new Document("bananas", "Bananas are an excellent source of potassium and vitamin B6.", Map.of("src", "food")),
      new Document("paris", "Paris is the capital and largest city of France.", Map.of("src", "geo", "lang", "en")),
      Document.of("rust", "The Rust borrow checker enforces memory safety at compile time."),
      Document.of("tides", "Ocean tides are caused by the gravitational pull of the moon."));

  static RagSidecarClient client;
  static SidecarReranker reranker;

  @BeforeAll
  static void connect(Sidecar sidecar) {
    client = sidecar.clientBuilder().build();
    reranker = client.reranker();
    reranker.awaitModels(Duration.ofSeconds(30));
  }

  @AfterAll
  static void disconnect() {
    if (client != null) {
      client.close();
    }
  }

  static Request france() {
    return Request.builder().query("What is the capital of France?").documents(FRANCE).build();
  }

  static void assertWellFormed(Request request, List<RankedDocument> ranked) {
    Set<Integer> seen = new HashSet<>();
    float previous = Float.POSITIVE_INFINITY;
    for (RankedDocument r : ranked) {
      assertTrue(seen.add(r.index()), "index repeated: " + r.index());
      assertEquals(request.documents().get(r.index()).id(), r.id());
      assertTrue(r.relevanceScore() >= 0f && r.relevanceScore() <= 1f, "relevance in 0..1: " + r);
      assertTrue(r.relevanceScore() <= previous, "descending relevance: " + ranked);
      previous = r.relevanceScore();
    }
  }

  @Test
  void relevantDocumentRanksFirstWithTheDefaultCrossEncoder() {
    Request request = france();
    List<RankedDocument> ranked = reranker.rerank(request);
    assertEquals(4, ranked.size());
    assertWellFormed(request, ranked);
    RankedDocument top = ranked.get(0);
    assertEquals("paris", top.id());
    assertEquals(1, top.index());
    assertTrue(top.relevanceScore() > 0.5f, "Paris is relevant: " + top);
    // Cross-encoder: relevance is the sigmoid of the raw logit.
    assertEquals(1.0 / (1.0 + Math.exp(-top.rawScore())), top.relevanceScore(), 1e-4);
    assertNull(top.document(), "no documents echoed unless asked");
    assertEquals(0, top.bestWindow());
  }

  @Test
  void relevantDocumentRanksFirstWithTheBiEncoder() {
    Request request = france().toBuilder().model(BI_ENCODER).build();
    List<RankedDocument> ranked = reranker.rerank(request);
    assertEquals(4, ranked.size());
    assertWellFormed(request, ranked);
    assertEquals("paris", ranked.get(0).id());
    // Bi-encoder: relevance is the cosine mapped to (cos + 1) / 2.
    assertEquals((ranked.get(0).rawScore() + 1) / 2, ranked.get(0).relevanceScore(), 1e-4);
  }

  @Test
  void topNKeepsTheBestDocuments() {
    List<RankedDocument> all = reranker.rerank(france());
    List<RankedDocument> two = reranker.rerank(france().toBuilder().topN(2).build());
    assertEquals(2, two.size());
    assertEquals(all.subList(0, 2).stream().map(RankedDocument::id).toList(),
        two.stream().map(RankedDocument::id).toList());
    assertEquals(0, reranker.rerank(france().toBuilder().topN(0).build()).size());
    assertEquals(4, reranker.rerank(france().toBuilder().topN(10).build()).size());
  }

  @Test
  void returnDocumentsEchoesTextAndMetadata() {
    Request request = france().toBuilder().returnDocuments(true).build();
    List<RankedDocument> ranked = reranker.rerank(request);
    assertEquals(4, ranked.size());
    for (RankedDocument r : ranked) {
      assertEquals(request.documents().get(r.index()), r.document());
    }
    assertEquals(Map.of("src", "geo", "lang", "en"), ranked.get(0).document().metadata());
  }

  @Test
  void minRelevanceScoreDropsIrrelevantDocuments() {
    List<RankedDocument> ranked = reranker.rerank(france().toBuilder().minRelevanceScore(0.5f).build());
    assertEquals(List.of("paris"), ranked.stream().map(RankedDocument::id).toList());
    assertTrue(reranker.rerank(Request.builder().query("What is the capital of France?")
        .document("x", "Bananas are yellow.").minRelevanceScore(0.99f).build()).isEmpty());
  }

  @Test
  void windowStrategyFindsTheRelevantPartOfALongDocument() {
    StringBuilder filler = new StringBuilder();
    for (int i = 0; i < 60; i++) {
      filler.append("Bananas are an excellent source of potassium and vitamin B6. ");
    }
    Request request = Request.builder()
        .query("What is the capital of France?")
        .document("long", filler + "Paris is the capital and largest city of France.")
        .document("tides", "Tides rise and fall twice a day.")
        .longDocumentStrategy(LongDocumentStrategy.WINDOW)
        .maxDocumentTokens(64)
        .build();
    List<RankedDocument> ranked = reranker.rerank(request);
    assertWellFormed(request, ranked);
    assertEquals("long", ranked.get(0).id());
    assertTrue(ranked.get(0).bestWindow() > 0, "the last window holds the answer: " + ranked.get(0));
    List<RankedDocument> truncated = reranker.rerank(
        request.toBuilder().longDocumentStrategy(LongDocumentStrategy.TRUNCATE).build());
    RankedDocument bananasOnly = truncated.stream().filter(r -> r.id().equals("long")).findFirst().orElseThrow();
    assertEquals(0, bananasOnly.bestWindow());
    assertTrue(bananasOnly.rawScore() < ranked.get(0).rawScore(), "the truncated part misses the answer: " + truncated);
  }

  @Test
  void supportsIsAnsweredLocallyFromTheModelSnapshot() {
    assertTrue(reranker.supports(CROSS_ENCODER));
    assertTrue(reranker.supports(BI_ENCODER));
    assertFalse(reranker.supports("MS-MARCO-MiniLM-L-12-v2"), "case-sensitive");
    assertFalse(reranker.supports("BGE-small-en-v1.5"));
    assertFalse(reranker.supports("bge-small-en"));
    assertFalse(reranker.supports("no-such-model"));
    assertFalse(reranker.supports(""));
    assertFalse(reranker.supports(null));

    ModelSnapshot snapshot = reranker.models().orElseThrow();
    assertEquals(List.of(CROSS_ENCODER, BI_ENCODER), snapshot.models().stream().map(ModelInfo::id).toList());
    assertEquals(CROSS_ENCODER, snapshot.defaultModel().orElseThrow().id());
    assertEquals(ModelInfo.Kind.CROSS_ENCODER, snapshot.model(CROSS_ENCODER).orElseThrow().kind());
    assertEquals(ModelInfo.Kind.BI_ENCODER, snapshot.model(BI_ENCODER).orElseThrow().kind());
    assertEquals(ModelInfo.State.READY, snapshot.model(BI_ENCODER).orElseThrow().state());
    assertEquals(512, snapshot.model(CROSS_ENCODER).orElseThrow().maxInputTokens());
  }

  @Test
  void supportsIsFalseUntilTheFirstSnapshotAndForAnUnreachableSidecar() throws Exception {
    int port;
    try (ServerSocket socket = new ServerSocket(0)) {
      port = socket.getLocalPort();
    }
    try (RagSidecarClient unreachable = RagSidecarClient.builder().port(port)
        .defaultDeadline(Duration.ofSeconds(2)).build()) {
      assertFalse(unreachable.reranker().supports(CROSS_ENCODER));
      assertTrue(unreachable.reranker().models().isEmpty());
      UnavailableException e = assertThrows(UnavailableException.class, () -> unreachable.reranker().rerank(france()));
      assertEquals(Status.Code.UNAVAILABLE, e.code());
      assertEquals("", e.reason());
      assertThrows(DeadlineExceededException.class,
          () -> unreachable.reranker().awaitModels(Duration.ofMillis(100)));
      assertFalse(unreachable.reranker().supports(CROSS_ENCODER));
    }
  }

  @Test
  void noOpSupportsNothingAndKeepsTheOrder() throws Exception {
    Reranker noOp = Reranker.noOp();
    assertSame(noOp, Reranker.noOp());
    assertFalse(noOp.supports(CROSS_ENCODER));
    assertFalse(noOp.supports(""));
    assertFalse(noOp.supports(null));
    List<RankedDocument> kept = noOp.rerank(france());
    assertEquals(List.of("bananas", "paris", "rust", "tides"), kept.stream().map(RankedDocument::id).toList());
    assertEquals(List.of(0, 1, 2, 3), kept.stream().map(RankedDocument::index).toList());
    assertTrue(Float.isNaN(kept.get(0).relevanceScore()));
    assertNull(kept.get(0).document());
    assertEquals(2, noOp.rerank(france().toBuilder().topN(2).build()).size());
    assertEquals(FRANCE.get(0), noOp.rerankAsync(france().toBuilder().returnDocuments(true).build())
        .get(1, TimeUnit.SECONDS).get(0).document());
  }

  @Test
  void unknownModelRaisesUnknownModelException() {
    UnknownModelException e = assertThrows(UnknownModelException.class,
        () -> reranker.rerank(france().toBuilder().model("no-such-model").build()));
    assertEquals(Status.Code.NOT_FOUND, e.code());
    assertEquals("UNKNOWN_MODEL", e.reason());
    assertEquals(RagSidecarException.DOMAIN, e.domain());
    assertEquals("no-such-model", e.model());
    assertInstanceOf(StatusRuntimeException.class, e.getCause());
    assertEquals(Status.Code.NOT_FOUND, ((StatusRuntimeException) e.getCause()).getStatus().getCode());
    assertTrue(e.getMessage().contains("no-such-model"), e.getMessage());

    // Model ids are case-sensitive.
    assertThrows(UnknownModelException.class,
        () -> reranker.rerank(france().toBuilder().model("MS-MARCO-MiniLM-L-12-v2").build()));
  }

  @Test
  void invalidRequestsRaiseValidationExceptionNamingEachField() {
    ValidationException blank = assertThrows(ValidationException.class,
        () -> reranker.rerank(Request.builder().query("  ").documents(FRANCE).build()));
    assertEquals(Status.Code.INVALID_ARGUMENT, blank.code());
    assertEquals("INVALID_REQUEST", blank.reason());
    assertEquals(List.of("query"), blank.violations().stream().map(ValidationException.FieldViolation::field)
        .toList());

    ValidationException several = assertThrows(ValidationException.class, () -> reranker.rerank(Request.builder()
        .query("")
        .document("a", "first")
        .document("a", "second, same id")
        .topN(-1)
        .build()));
    assertTrue(several.hasViolation("query"), several.violations().toString());
    assertTrue(several.hasViolation("documents[1].id"), several.violations().toString());
    assertTrue(several.hasViolation("top_n"), several.violations().toString());
    assertEquals(3, several.violations().size(), several.violations().toString());
    several.violations().forEach(v -> assertFalse(v.description().isEmpty()));

    ValidationException none = assertThrows(ValidationException.class,
        () -> reranker.rerank(Request.builder().query("anything").build()));
    assertTrue(none.hasViolation("documents"), none.violations().toString());

    ValidationException threshold = assertThrows(ValidationException.class,
        () -> reranker.rerank(france().toBuilder().minRelevanceScore(1.5f).build()));
    assertTrue(threshold.hasViolation("min_relevance_score"), threshold.violations().toString());
  }

  @Test
  void asyncVariantCompletesWithTheSameResultsAndErrors() throws Exception {
    CompletableFuture<List<RankedDocument>> future = reranker.rerankAsync(france().toBuilder().topN(1).build());
    List<RankedDocument> ranked = future.get(30, TimeUnit.SECONDS);
    assertEquals(List.of("paris"), ranked.stream().map(RankedDocument::id).toList());

    CompletableFuture<List<RankedDocument>> failing =
        reranker.rerankAsync(france().toBuilder().model("no-such-model").build());
    ExecutionException e = assertThrows(ExecutionException.class, () -> failing.get(30, TimeUnit.SECONDS));
    UnknownModelException cause = assertInstanceOf(UnknownModelException.class, e.getCause());
    assertEquals("UNKNOWN_MODEL", cause.reason());

    List<CompletableFuture<List<RankedDocument>>> many = new ArrayList<>();
    for (int i = 0; i < 8; i++) {
      many.add(reranker.rerankAsync(france()));
    }
    CompletableFuture.allOf(many.toArray(CompletableFuture[]::new)).get(60, TimeUnit.SECONDS);
    for (CompletableFuture<List<RankedDocument>> f : many) {
      assertEquals("paris", f.join().get(0).id());
    }
  }

  @Test
  void concurrentUseFromManyThreadsReturnsCorrectResults() throws Exception {
    record Case(String query, String expected) {}
    List<Case> cases = List.of(
        new Case("What is the capital of France?", "paris"),
        new Case("Which fruit contains a lot of potassium?", "bananas"),
        new Case("How does Rust guarantee memory safety?", "rust"),
        new Case("What causes the tides of the ocean?", "tides"));
    int threads = 16;
    int perThread = 4;
    ExecutorService pool = Executors.newFixedThreadPool(threads);
    try {
      List<Future<Integer>> futures = new ArrayList<>();
      for (int t = 0; t < threads; t++) {
        int seed = t;
        futures.add(pool.submit(() -> {
          Random random = new Random(seed);
          int done = 0;
          for (int i = 0; i < perThread; i++) {
            Case c = cases.get((seed + i) % cases.size());
            List<Document> shuffled = new ArrayList<>(FRANCE);
            Collections.shuffle(shuffled, random);
            Request request = Request.builder().query(c.query()).documents(shuffled)
                .model(i % 2 == 0 ? CROSS_ENCODER : BI_ENCODER).build();
            List<RankedDocument> ranked = reranker.rerank(request);
            assertWellFormed(request, ranked);
            assertEquals(4, ranked.size());
            assertEquals(c.expected(), ranked.get(0).id(), "query: " + c.query());
            assertTrue(reranker.supports(CROSS_ENCODER));
            done++;
          }
          return done;
        }));
      }
      int total = 0;
      for (Future<Integer> f : futures) {
        total += f.get(120, TimeUnit.SECONDS);
      }
      assertEquals(threads * perThread, total);
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void deadlineExceededIsMapped(Sidecar sidecar) {
    List<Document> big = new ArrayList<>();
    for (int i = 0; i < 300; i++) {
      big.add(Document.of("d" + i, "Document number " + i + " talks about subject " + (i * 7919 % 1000)
          + " at considerable length, sentence after sentence."));
    }
    Request request = Request.builder().query("What is the capital of France?").documents(big)
        .timeout(Duration.ofMillis(1)).build();
    DeadlineExceededException e = assertThrows(DeadlineExceededException.class, () -> reranker.rerank(request));
    assertEquals(Status.Code.DEADLINE_EXCEEDED, e.code());
    assertInstanceOf(StatusRuntimeException.class, e.getCause());

    ExecutionException async = assertThrows(ExecutionException.class,
        () -> reranker.rerankAsync(request).get(30, TimeUnit.SECONDS));
    assertInstanceOf(DeadlineExceededException.class, async.getCause());

    try (RagSidecarClient impatient = sidecar.clientBuilder().defaultDeadline(Duration.ofMillis(1)).build()) {
      assertThrows(DeadlineExceededException.class,
          () -> impatient.reranker().rerank(request.toBuilder().timeout(null).build()));
    }
  }

  @Test
  void closedClientFailsWithUnavailable(Sidecar sidecar) {
    RagSidecarClient closing = sidecar.clientBuilder().build();
    assertEquals("paris", closing.reranker().rerank(france()).get(0).id());
    closing.close();
    closing.close();
    assertTrue(closing.isClosed());
    assertThrows(UnavailableException.class, () -> closing.reranker().rerank(france()));
  }
}
