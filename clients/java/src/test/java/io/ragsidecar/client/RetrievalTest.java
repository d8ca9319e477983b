package io.ragsidecar.client;

import static io.ragsidecar.client.RetrievalRequests.action;
import static io.ragsidecar.client.RetrievalRequests.directory;
import static io.ragsidecar.client.RetrievalRequests.document;
import static io.ragsidecar.client.RetrievalRequests.file;
import static io.ragsidecar.client.RetrievalRequests.inline;
import static io.ragsidecar.client.RetrievalRequests.llm;
import static io.ragsidecar.client.RetrievalRequests.memory;
import static io.ragsidecar.client.RetrievalRequests.params;
import static io.ragsidecar.client.RetrievalRequests.target;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.extension.ExtendWith;
import io.ragsidecar.v1.EnforceRequest;
import io.ragsidecar.v1.KnowledgeEntry;
import io.ragsidecar.v1.KnowledgeNames;
import io.ragsidecar.v1.KnowledgeOnFailure;
import io.ragsidecar.v1.KnowledgeReadiness;
import io.ragsidecar.v1.KnowledgeUse;
import io.ragsidecar.v1.PrepareChatKnowledgeRequest;
import io.ragsidecar.v1.RequireLoadedRequest;
import io.ragsidecar.v1.RequireReadyRequest;
import io.ragsidecar.v1.RerankOrder;
import io.ragsidecar.v1.SearchOptions;
import io.ragsidecar.v1.SearchRequest;
import io.ragsidecar.v1.Target;
import io.ragsidecar.v1.ValidateConfigurationRequest;

/**
 * {@link SidecarRetrieval} through the real sidecar, on a knowledge root of real files (a Markdown policy, a text
 * file, JSON Lines records) and the real embedder and reranker.
 */
@ExtendWith(SidecarExtension.class)
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class RetrievalTest {
  private static final String ROLE = "com.acme.SupportRole";
  private static final KnowledgeScope SCOPE = new KnowledgeScope("agent-host", "acme", "s1");

  private static final KnowledgeUse DIRECT = KnowledgeUse.KNOWLEDGE_USE_DIRECT;
  private static final KnowledgeUse SEARCH = KnowledgeUse.KNOWLEDGE_USE_SEARCH;
  private static final KnowledgeUse SEQUENTIAL = KnowledgeUse.KNOWLEDGE_USE_SEQUENTIAL;
  private static final KnowledgeReadiness WHEN_CONFIGURED = KnowledgeReadiness.KNOWLEDGE_READINESS_WHEN_CONFIGURED;

  private static final KnowledgeEntry PERSONA = file("persona", DIRECT, "persona.md").build();
  private static final KnowledgeEntry POLICY = directory("policy", SEARCH, "policy").build();
  private static final KnowledgeEntry PRODUCTS = file("products", SEARCH, "products.jsonl").setTopK(3).build();
  private static final KnowledgeEntry STEPS = file("steps", SEQUENTIAL, "steps.jsonl").build();

  private static final Map<String, String> PRODUCTS_JSONL = new LinkedHashMap<>();

  static {
    PRODUCTS_JSONL.put("kettle", "The Kettle K1 holds 1.7 litres of water and brings it to the boil in three minutes.");
    PRODUCTS_JSONL.put("blender", "The Blender X2 has a 900 watt motor, six speeds and crushes ice for smoothies.");
    PRODUCTS_JSONL.put("toaster", "The Toaster T4 browns four slices of bread at once and has a bagel setting.");
    PRODUCTS_JSONL.put("grinder", "The Grinder G3 grinds coffee beans with steel burrs in eighteen coarseness steps.");
    PRODUCTS_JSONL.put("fridge", "The Fridge F9 keeps groceries cold with 350 litres of space and an ice dispenser.");
  }

  private RagSidecarClient client;
  private SidecarRetrieval retrieval;
  private Path root;

  @BeforeAll
  void start(@SidecarExtension.Options(ownKnowledge = true) Sidecar sidecar) throws IOException {
    root = sidecar.knowledgeRoot();
    write("persona.md", "You are Ada, a support agent for Acme Kitchen. Be brief and friendly.\n");
    write("policy/returns.md", "# Returns policy\n\nItems can be returned within 30 days of delivery.\n"
        + "Refunds go back to the original payment method within 5 business days.\n");
    write("policy/shipping.txt", "Standard shipping takes 3 to 5 business days.\n"
        + "Express shipping arrives the next business day.\n");
    write("products.jsonl", PRODUCTS_JSONL.entrySet().stream()
        .map(e -> "{\"id\": \"" + e.getKey() + "\", \"text\": \"" + e.getValue() + "\"}")
        .collect(Collectors.joining("\n", "", "\n")));
    write("steps.jsonl", String.join("\n",
        "{\"id\": \"step1\", \"text\": \"Step 1: Greet the customer.\"}",
        "{\"id\": \"step2\", \"text\": \"Step 2: Ask for the order number.\"}",
        "{\"id\": \"step3\", \"text\": \"Step 3: Check the order status.\"}",
        "{\"id\": \"step4\", \"text\": \"Step 4: Offer a solution.\"}") + "\n");
    write("empty.txt", "");
    Files.write(root.resolve("binary.txt"), new byte[] {0, 1, 2, (byte) 0xff, 0, 1, 2, (byte) 0xfe});
    client = sidecar.clientBuilder().defaultDeadline(Duration.ofSeconds(120)).build();
    retrieval = client.retrieval().withScope(SCOPE);
  }

  @AfterAll
  void stop() {
    client.close();
  }

  private void write(String relative, String text) throws IOException {
    Path path = root.resolve(relative);
    Files.createDirectories(path.getParent());
    Files.writeString(path, text, StandardCharsets.UTF_8);
  }

  private static Target role(List<KnowledgeEntry> entries, String... knowledge) {
    return target(ROLE, entries, action("answer", knowledge));
  }

  private static EnforceRequest.Builder enforce(List<KnowledgeEntry> entries, String... knowledge) {
    return EnforceRequest.newBuilder().setTarget(role(entries, knowledge)).setAction("answer")
        .setLlm(llm("test-model", 8000));
  }

  private static Map<String, Object> ordered(Object... nameValues) {
    Map<String, Object> out = new LinkedHashMap<>();
    for (int i = 0; i < nameValues.length; i += 2) {
      out.put((String) nameValues[i], nameValues[i + 1]);
    }
    return out;
  }

  private static String topDocument(RetrievedContext context) {
    return context.blocks().get(0).chunks().get(0).documentId();
  }

  // ---- ValidateConfiguration ------------------------------------------------------------------------------------

  @Test
  void validateConfigurationIsValidOrReportsEveryViolationAtOnce() {
    ConfigurationValidation good = retrieval.validateConfiguration(ValidateConfigurationRequest.newBuilder()
        .setTarget(role(List.of(PRODUCTS, PERSONA, STEPS), "products", "persona")).setLlm(llm("test-model", 8000))
        .build());
    assertTrue(good.valid(), good.violations()::toString);
    assertEquals(List.of(), good.violations());

    List<KnowledgeEntry> bad = List.of(
        file("nofile", SEARCH, "").build(),
        file("escape", SEARCH, "../../etc/passwd").build(),
        file("contradiction", SEARCH, "policy/shipping.txt").setMinScore(1.5f).build(),
        file("zero", SEARCH, "policy/shipping.txt").setTopK(0).build(),
        inline("blank", DIRECT, "").build(),
        file("ghost-model", SEARCH, "policy/shipping.txt")
            .setSearch(SearchOptions.newBuilder().setRerank(true).setRerankerModel("no-such-reranker")).build());
    ConfigurationValidation result = retrieval.validateConfiguration(ValidateConfigurationRequest.newBuilder()
        .setTarget(role(bad, "nofile", "missing-name")).setLlm(llm("test-model", 8000)).build());
    assertFalse(result.valid());
    Set<List<String>> found = result.violations().stream()
        .map(v -> List.of(v.field(), v.reason())).collect(Collectors.toSet());
    Set<List<String>> expected = Set.of(
        List.of("target.knowledge[0].path", "INVALID_CONFIGURATION"),
        List.of("target.knowledge[1].path", "PATH_OUTSIDE_ROOTS"),
        List.of("target.knowledge[2].min_score", "INVALID_CONFIGURATION"),
        List.of("target.knowledge[3].top_k", "INVALID_CONFIGURATION"),
        List.of("target.knowledge[4].inline_text", "INVALID_CONFIGURATION"),
        List.of("target.knowledge[5].search.reranker_model", "UNKNOWN_MODEL"),
        List.of("target.actions[0].knowledge[1]", "UNKNOWN_KNOWLEDGE"));
    assertTrue(found.containsAll(expected), "violations: " + result.violations());
    assertTrue(result.violations().stream().noneMatch(v -> v.description().isBlank()));
    assertTrue(result.hasViolation("target.knowledge[1].path"));
    assertEquals(1, result.withReason("PATH_OUTSIDE_ROOTS").size());
    assertThrows(IllegalStateException.class, result::orThrow);
  }

  // ---- Enforce --------------------------------------------------------------------------------------------------

  @Test
  void enforceGivesDirectKnowledgeWhole() {
    RetrievedContext context = retrieval.enforce(enforce(List.of(PERSONA, PRODUCTS), "persona")
        .addAllParams(params(ordered("question", "hi"))).build());
    assertTrue(context.retrievedContext().startsWith("### Knowledge: persona (DIRECT)"), context.retrievedContext());
    assertTrue(context.retrievedContext().contains("You are Ada, a support agent for Acme Kitchen."));
    assertEquals(1, context.documentCount());
    assertFalse(context.truncated());
    assertEquals(List.of(), context.staleFallbacks());
    assertEquals(1, context.blocks().size());
    RetrievedContext.Block block = context.blocks().get(0);
    assertEquals("persona", block.source());
    assertEquals(DIRECT, block.use());
    assertFalse(block.chunks().get(0).proto().hasScore());
    assertFalse(block.chunks().get(0).isScored());
  }

  @Test
  void enforceSearchesWithTheFirstStringParameterAndRanksTheRightRecordFirst() {
    Map<String, String> questions = Map.of(
        "How long does the kettle take to boil water?", "kettle",
        "Which appliance can crush ice for a smoothie?", "blender",
        "I need something to grind my coffee beans", "grinder");
    questions.forEach((question, expected) -> {
      // A number first: the first *string* parameter is the query.
      RetrievedContext context = retrieval.enforce(enforce(List.of(PRODUCTS), "products")
          .addAllParams(params(ordered("limit", 3, "question", question, "tone", "friendly"))).build());
      assertEquals(question, context.query());
      assertEquals(expected, topDocument(context), context.retrievedContext());
      assertTrue(context.retrievedContext().startsWith("### Knowledge: products (SEARCH)"));
      assertTrue(context.retrievedContext().contains("products.jsonl"));
      KnowledgeChunk top = context.blocks().get(0).chunks().get(0);
      assertTrue(top.isScored() && top.proto().getScores().getDense() > 0, top::toString);
      assertTrue(context.documentCount() >= 1 && context.documentCount() <= 3);
    });
  }

  @Test
  void enforceDirectoryAndDeclaredQueryParameterAndBenignEmptyCases() {
    Target declared = Target.newBuilder(role(List.of(POLICY), "policy"))
        .setActions(0, action("answer", "policy").toBuilder().setQueryParameter("claim")).build();
    RetrievedContext context = retrieval.enforce(EnforceRequest.newBuilder().setTarget(declared).setAction("answer")
        .addAllParams(params(ordered("topic", "unrelated words", "claim", "how fast is express shipping?")))
        .build());
    assertEquals("how fast is express shipping?", context.query());
    assertTrue(context.blocks().get(0).chunks().get(0).text().contains("next business day"));

    // No string parameter, a blank one, no knowledge named: all benign and empty.
    assertTrue(retrieval.enforce(enforce(List.of(PRODUCTS), "products")
        .addAllParams(params(ordered("n", 3, "when", List.of("x")))).build()).isEmpty());
    assertTrue(retrieval.enforce(enforce(List.of(PRODUCTS), "products")
        .addAllParams(params(ordered("q", "   "))).build()).isEmpty());
    RetrievedContext none = retrieval.enforce(enforce(List.of(PRODUCTS)).build());
    assertEquals("", none.retrievedContext());
    assertEquals(0, none.documentCount());
    KnowledgeEntry later = file("later", SEARCH, "not-there.md").setReadiness(WHEN_CONFIGURED).build();
    assertTrue(retrieval.enforce(enforce(List.of(later), "later").addAllParams(params(ordered("q", "x"))).build())
        .isEmpty());
  }

  @Test
  void enforceSequentialGivesOneUnitPerCallInOrderPerSession() {
    SidecarRetrieval session = client.retrieval().withScope(SCOPE.withSession("seq-" + UUID.randomUUID()));
    List<String> given = new ArrayList<>();
    for (int i = 0; i < 5; i++) {
      given.add(session.enforce(enforce(List.of(STEPS), "steps").build()).retrievedContext());
    }
    for (int i = 1; i <= 4; i++) {
      assertTrue(given.get(i - 1).contains("Step " + i + ":"), given.toString());
      for (int j = 1; j <= 4; j++) {
        if (j != i) {
          assertFalse(given.get(i - 1).contains("Step " + j + ":"), given.toString());
        }
      }
    }
    assertEquals("", given.get(4)); // every unit given: nothing more
    SidecarRetrieval other = client.retrieval().withScope(SCOPE.withSession("seq-" + UUID.randomUUID()));
    assertTrue(other.enforce(enforce(List.of(STEPS), "steps").build()).retrievedContext().contains("Step 1:"));
  }

  @Test
  void enforceCutsToTheContextWindowAndFlagsIt() {
    EnforceRequest.Builder request = enforce(List.of(PERSONA, PRODUCTS), "persona", "products")
        .addAllParams(params(ordered("q", "kettle boiling time")));
    RetrievedContext full = retrieval.enforce(request.build());
    RetrievedContext cut = retrieval.enforce(request.setMaxContextTokens(40).build());
    assertFalse(full.truncated());
    assertTrue(cut.truncated());
    assertTrue(cut.retrievedContext().length() < full.retrievedContext().length());
  }

  // ---- RequireLoaded / RequireReady -----------------------------------------------------------------------------

  @Test
  void requireLoadedReturnsCountsInSortedNameOrder() {
    LinkedHashMap<String, Integer> counts = retrieval.requireLoaded(RequireLoadedRequest.newBuilder()
        .setTarget(role(List.of(PRODUCTS, POLICY, PERSONA))).addNames("products").addNames("policy").build());
    assertEquals(List.of("policy", "products"), List.copyOf(counts.keySet()));
    assertEquals(Map.of("policy", 2, "products", PRODUCTS_JSONL.size()), counts);
    ValidationException notSearch = assertThrows(ValidationException.class,
        () -> retrieval.requireLoaded(RequireLoadedRequest.newBuilder()
            .setTarget(role(List.of(PRODUCTS, PERSONA))).addNames("persona").build()));
    assertEquals("INVALID_REQUEST", notSearch.reason());
    ValidationException unknown = assertThrows(ValidationException.class,
        () -> retrieval.requireLoaded(RequireLoadedRequest.newBuilder()
            .setTarget(role(List.of(PRODUCTS))).addNames("nope").build()));
    assertEquals("UNKNOWN_KNOWLEDGE", unknown.reason());
  }

  @Test
  void requireReadyNamesEveryEmptySource() {
    SidecarRetrieval fresh = client.retrieval().withScope(SCOPE.withSession("ready-" + UUID.randomUUID()));
    List<KnowledgeEntry> entries = List.of(
        file("zeta", SEARCH, "empty.txt").setReadiness(WHEN_CONFIGURED).build(),
        memory("alpha", SEARCH).setReadiness(WHEN_CONFIGURED).build(),
        file("ok", SEARCH, "policy/shipping.txt").setReadiness(WHEN_CONFIGURED).build(),
        file("unconfigured", SEARCH, "").setReadiness(WHEN_CONFIGURED).build(),
        PERSONA);
    KnowledgeNotReadyException e = assertThrows(KnowledgeNotReadyException.class,
        () -> fresh.requireReady(RequireReadyRequest.newBuilder().setTarget(role(entries)).build()));
    assertEquals("KNOWLEDGE_NOT_READY", e.reason());
    assertEquals(List.of("alpha", "zeta"), e.sources());
    assertEquals(Set.of("knowledge[alpha]", "knowledge[zeta]"),
        e.violations().stream().map(ValidationException.FieldViolation::field).collect(Collectors.toSet()));

    LinkedHashMap<String, Integer> ready = fresh.requireReady(RequireReadyRequest.newBuilder()
        .setTarget(role(entries.subList(2, entries.size()))).build());
    assertEquals(Map.of("ok", 1), ready);
    assertEquals(Map.of(), fresh.requireReady(RequireReadyRequest.newBuilder().setTarget(role(List.of())).build()));
  }

  // ---- PrepareChatKnowledge -------------------------------------------------------------------------------------

  @Test
  void prepareChatKnowledgeMeasuresDirectEntries() {
    List<KnowledgeEntry> entries = List.of(PRODUCTS, PERSONA,
        inline("rules", DIRECT, "Never share card numbers.").setMaxTokens(50).build());
    PreparedChatKnowledge prepared = retrieval.prepareChatKnowledge(PrepareChatKnowledgeRequest.newBuilder()
        .setAgentId("ada").addAllEntries(entries).setLlm(llm("test-model", 10000)).build());
    assertEquals(List.of("persona", "rules"), prepared.blocks().stream().map(DirectBlock::source).toList());
    assertEquals(List.of(1, 2), prepared.blocks().stream().map(DirectBlock::position).toList());
    assertTrue(prepared.blocks().get(0).sharedBudget());
    assertEquals(50, prepared.blocks().get(1).budgetTokens());
    assertTrue(prepared.blocks().get(1).text().contains("card numbers"));
    assertEquals(2500, prepared.defaultBudgetTokens());
    assertEquals(10000, prepared.inputWindowTokens());

    FailedPreconditionException noWindow = assertThrows(FailedPreconditionException.class,
        () -> retrieval.prepareChatKnowledge(PrepareChatKnowledgeRequest.newBuilder().setAgentId("ada")
            .addAllEntries(entries).setLlm(llm("unknown-llm")).build()));
    assertEquals(FailedPreconditionException.UNKNOWN_MODEL_WINDOW, noWindow.reason());
  }

  @Test
  void failedPreconditionsCarryTheirReasonAndSources() {
    KnowledgeEntry tooBig = file("catalog", DIRECT, "products.jsonl").setMaxTokens(5).build();
    FailedPreconditionException budget = assertThrows(FailedPreconditionException.class,
        () -> retrieval.enforce(enforce(List.of(tooBig), "catalog").build()));
    assertFalse(budget instanceof KnowledgeNotReadyException);
    assertEquals(FailedPreconditionException.DIRECT_BUDGET_EXCEEDED, budget.reason());
    assertEquals(List.of("catalog"), budget.sources());

    KnowledgeEntry broken = file("broken", SEARCH, "binary.txt").build();
    FailedPreconditionException unreadable = assertThrows(FailedPreconditionException.class,
        () -> retrieval.enforce(enforce(List.of(broken), "broken").addAllParams(params(ordered("q", "x"))).build()));
    assertEquals(FailedPreconditionException.SOURCE_UNREADABLE, unreadable.reason());
    // With on_failure CONTINUE the broken source is dropped and the action gets the rest.
    KnowledgeEntry tolerant = broken.toBuilder().setOnFailure(KnowledgeOnFailure.KNOWLEDGE_ON_FAILURE_CONTINUE).build();
    RetrievedContext rest = retrieval.enforce(enforce(List.of(tolerant, PERSONA), "broken", "persona")
        .addAllParams(params(ordered("q", "x"))).build());
    assertEquals(List.of("persona"), rest.blocks().stream().map(RetrievedContext.Block::source).toList());

    KnowledgeEntry missing = file("must", SEARCH, "not-there.md").build();
    KnowledgeNotReadyException notReady = assertThrows(KnowledgeNotReadyException.class,
        () -> retrieval.enforce(enforce(List.of(missing), "must").addAllParams(params(ordered("q", "x"))).build()));
    assertEquals(List.of("must"), notReady.sources());
  }

  @Test
  void unknownRerankerModelOfAnEntryIsAnUnknownModelAtUse() {
    // ValidateConfiguration lists an unknown reranker among its violations; at use it is NOT_FOUND / UNKNOWN_MODEL.
    KnowledgeEntry ghost = PRODUCTS.toBuilder()
        .setSearch(SearchOptions.newBuilder().setRerank(true).setRerankerModel("no-such-reranker")).build();
    UnknownModelException unknown = assertThrows(UnknownModelException.class,
        () -> retrieval.enforce(enforce(List.of(ghost), "products").addAllParams(params(ordered("q", "kettle")))
            .build()));
    assertEquals("UNKNOWN_MODEL", unknown.reason());
  }

  // ---- Search and MEMORY ----------------------------------------------------------------------------------------

  @Test
  void searchSpansSourcesAndRerankOrdersHits() {
    SearchResult response = retrieval.search(SearchRequest.newBuilder()
        .setTarget(target(ROLE, List.of(PRODUCTS, POLICY))).setQuery("within how many days can items be returned?")
        .setTopK(2).build());
    assertTrue(response.hits().size() > 0 && response.hits().size() <= 4);
    assertEquals("policy", response.hits().get(0).source());
    assertTrue(response.hits().get(0).file().endsWith("returns.md"));
    assertEquals(response.proto().getHits(0), response.hits().get(0).proto());

    SearchResult reranked = retrieval.search(SearchRequest.newBuilder()
        .setTarget(target(ROLE, List.of(PRODUCTS))).setQuery("toast four slices of bread").setTopK(3)
        .setSearch(SearchOptions.newBuilder().setRerank(true)).build());
    assertEquals("toaster", reranked.hits().get(0).documentId());
    assertTrue(reranked.hits().stream().allMatch(h -> h.rerankScore().isPresent()));
    // By default the score is the fusion of the reranker's order with the retrieval order, not the relevance ...
    assertTrue(reranked.hits().stream().allMatch(h -> h.score() != h.rerankScore().getAsDouble()));
    // ... and with the Reranker SPI's order it is the relevance itself, descending.
    SearchResult pure = retrieval.search(SearchRequest.newBuilder()
        .setTarget(target(ROLE, List.of(PRODUCTS))).setQuery("toast four slices of bread").setTopK(3)
        .setSearch(RetrievalRequests.rerank(null, RerankOrder.RERANK_ORDER_RERANKER)).build());
    assertEquals("toaster", pure.hits().get(0).documentId());
    double previous = Double.POSITIVE_INFINITY;
    for (KnowledgeChunk hit : pure.hits()) {
      assertEquals(hit.rerankScore().getAsDouble(), hit.score(), hit::toString);
      assertTrue(hit.score() <= previous, pure::toString);
      previous = hit.score();
    }

    ValidationException blank = assertThrows(ValidationException.class, () -> retrieval.search(
        SearchRequest.newBuilder().setTarget(target(ROLE, List.of(PRODUCTS))).setQuery("  ").build()));
    assertEquals("INVALID_REQUEST", blank.reason());
  }

  @Test
  void memoryUpsertAndDeleteAreIsolatedByTenant() {
    KnowledgeEntry notes = memory("notes", SEARCH).build();
    String session = "mem-" + UUID.randomUUID();
    SidecarRetrieval acme = client.retrieval().withScope(SCOPE.withSession(session));
    SidecarRetrieval intruder = client.retrieval().withScope(new KnowledgeScope("agent-host", "globex", session));
    List<io.ragsidecar.v1.MemoryDocument> docs = List.of(
        document("n1", "The customer Bob prefers delivery on Saturdays.", Map.of("author", "ada")),
        document("n2", "The warehouse in Leeds closes at 6pm."));

    assertEquals(new SidecarRetrieval.UpsertResult(2, 0, 0, 2), acme.upsertDocuments("notes", docs));
    assertEquals(new SidecarRetrieval.UpsertResult(0, 0, 2, 2), acme.upsertDocuments("notes", docs));

    SearchRequest search = SearchRequest.newBuilder().setTarget(target(ROLE, List.of(notes)))
        .setQuery("when does Bob want his delivery?").build();
    assertEquals("n1", acme.search(search).hits().get(0).documentId());
    assertTrue(intruder.search(search).isEmpty());
    RetrievedContext enforced = acme.enforce(enforce(List.of(notes), "notes")
        .addAllParams(params(ordered("q", "Bob delivery day"))).build());
    assertTrue(enforced.retrievedContext().contains("Saturdays"));
    assertTrue(intruder.enforce(enforce(List.of(notes), "notes")
        .addAllParams(params(ordered("q", "Bob delivery day"))).build()).isEmpty());
    // The intruder's delete does not touch acme's documents.
    assertEquals(0, intruder.deleteDocuments("notes", List.of("n1")).deleted());

    assertEquals(new SidecarRetrieval.DeleteResult(1, 1, 1), acme.deleteDocuments("notes", List.of("n1", "n1", "zz")));
    assertEquals(List.of("n2"), acme.search(search.toBuilder().setQuery("Bob delivery Saturdays").build())
        .hits().stream().map(KnowledgeChunk::documentId).toList());

    ValidationException duplicate = assertThrows(ValidationException.class,
        () -> acme.upsertDocuments("notes", List.of(document("d", "a"), document("d", "b"))));
    assertEquals("INVALID_REQUEST", duplicate.reason());
  }

  // ---- Authorization and confinement ----------------------------------------------------------------------------

  @Test
  void pathsOutsideTheKnowledgeRootsArePermissionDenied() {
    KnowledgeEntry located = file("notes", DIRECT, "").build();
    RetrievedContext inside = retrieval.enforce(enforce(List.of(located), "notes")
        .putResolvedPaths("notes", "policy/returns.md").build());
    assertTrue(inside.retrievedContext().contains("within 30 days"));
    for (String path : List.of("../x", "policy/../../x", "/etc/passwd")) {
      PermissionDeniedException e = assertThrows(PermissionDeniedException.class,
          () -> retrieval.enforce(enforce(List.of(located), "notes").putResolvedPaths("notes", path).build()), path);
      assertEquals(PermissionDeniedException.PATH_OUTSIDE_ROOTS, e.reason());
      assertTrue(e.isPathOutsideRoots());
    }
    KnowledgeEntry declared = file("escape", DIRECT, "../x").build();
    assertTrue(assertThrows(PermissionDeniedException.class,
        () -> retrieval.enforce(enforce(List.of(declared), "escape").build())).isPathOutsideRoots());
    ValidationException unknown = assertThrows(ValidationException.class,
        () -> retrieval.enforce(enforce(List.of(located), "notes").putResolvedPaths("other", "persona.md").build()));
    assertEquals("UNKNOWN_KNOWLEDGE", unknown.reason());
  }

  @Test
  void missingPrincipalIsPermissionDeniedAndMissingTenantInvalid() {
    EnforceRequest request = enforce(List.of(PERSONA), "persona").build();
    // The unscoped facade sends the request as it is: no principal, no scope.
    PermissionDeniedException noPrincipal = assertThrows(PermissionDeniedException.class,
        () -> client.retrieval().enforce(request));
    assertEquals(PermissionDeniedException.PERMISSION_DENIED, noPrincipal.reason());
    assertFalse(noPrincipal.isPathOutsideRoots());
    assertThrows(PermissionDeniedException.class,
        () -> client.retrieval().withScope(new KnowledgeScope("", "acme", "s1")).enforce(request));
    ValidationException noTenant = assertThrows(ValidationException.class,
        () -> client.retrieval().withScope(new KnowledgeScope("agent-host", "", "s1")).enforce(request));
    assertEquals("INVALID_REQUEST", noTenant.reason());
    // A request carrying its own principal and scope works unscoped.
    RetrievedContext own = client.retrieval().enforce(request.toBuilder()
        .setPrincipal(SCOPE.principal()).setScope(SCOPE.scope()).build());
    assertEquals(1, own.documentCount());
  }

  // ---- Async and concurrency ------------------------------------------------------------------------------------

  @Test
  void asyncVariantsCompleteAndFailWithTheSameTypes() {
    CompletableFuture<RetrievedContext> context = retrieval.enforceAsync(enforce(List.of(PRODUCTS), "products")
        .addAllParams(params(ordered("q", "boil water in a kettle"))).build());
    CompletableFuture<LinkedHashMap<String, Integer>> loaded = retrieval.requireLoadedAsync(
        RequireLoadedRequest.newBuilder().setTarget(role(List.of(PRODUCTS))).addNames("products").build());
    CompletableFuture<ConfigurationValidation> valid = retrieval.validateConfigurationAsync(
        ValidateConfigurationRequest.newBuilder().setTarget(role(List.of(PERSONA), "persona"))
            .setLlm(llm("test-model", 8000)).build());
    assertEquals("kettle", topDocument(context.join()));
    assertEquals(Map.of("products", PRODUCTS_JSONL.size()), loaded.join());
    assertTrue(valid.join().valid());

    CompletionException failed = assertThrows(CompletionException.class,
        () -> client.retrieval().searchAsync(SearchRequest.newBuilder()
            .setTarget(target(ROLE, List.of(PRODUCTS))).setQuery("kettle").build()).join());
    assertInstanceOf(PermissionDeniedException.class, failed.getCause());
    CompletionException notReady = assertThrows(CompletionException.class,
        () -> retrieval.requireReadyAsync(RequireReadyRequest.newBuilder().setTarget(role(List.of(
            file("zeta", SEARCH, "empty.txt").setReadiness(WHEN_CONFIGURED).build()))).build()).join());
    assertEquals(List.of("zeta"), assertInstanceOf(KnowledgeNotReadyException.class, notReady.getCause()).sources());
  }

  @Test
  void enforceIsSafeToCallFromManyThreads() throws Exception {
    Map<String, String> questions = new LinkedHashMap<>();
    questions.put("How long does the kettle take to boil water?", "kettle");
    questions.put("Which appliance can crush ice for a smoothie?", "blender");
    questions.put("Can it toast bagels?", "toaster");
    questions.put("What keeps my groceries cold?", "fridge");
    List<Map.Entry<String, String>> cases = List.copyOf(questions.entrySet());
    ExecutorService pool = Executors.newFixedThreadPool(8);
    try {
      List<Future<String>> results = new ArrayList<>();
      for (int i = 0; i < 32; i++) {
        Map.Entry<String, String> c = cases.get(i % cases.size());
        boolean async = i % 2 == 1;
        results.add(pool.submit(() -> {
          EnforceRequest request = enforce(List.of(PERSONA, PRODUCTS), "persona", "products")
              .addAllParams(params(ordered("question", c.getKey()))).build();
          RetrievedContext context = async ? retrieval.enforceAsync(request).join() : retrieval.enforce(request);
          assertEquals(c.getKey(), context.query());
          assertEquals("persona", context.blocks().get(0).source());
          return context.blocks().get(1).chunks().get(0).documentId();
        }));
      }
      for (int i = 0; i < results.size(); i++) {
        assertEquals(cases.get(i % cases.size()).getValue(), results.get(i).get(120, TimeUnit.SECONDS), "call " + i);
      }
    } finally {
      pool.shutdownNow();
    }
  }

  // ---- Plain overloads -----------------------------------------------------------------------------------------

  /** What a context's blocks hold, by source and chunk id (scores may differ in the last bits between calls). */
  private static List<String> chunkIds(RetrievedContext context) {
    return context.blocks().stream()
        .flatMap(b -> b.chunks().stream().map(c -> b.source() + "/" + c.chunkId())).toList();
  }

  private static List<String> chunkIds(SearchResult result) {
    return result.hits().stream().map(h -> h.source() + "/" + h.chunkId()).toList();
  }

  @Test
  void plainOverloadsAnswerAsTheirRequestsDo() {
    Target direct = role(List.of(PERSONA), "persona");
    // Declarations only: a DIRECT entry without max_tokens needs no model, where the measuring check without one
    // reports UNKNOWN_MODEL_WINDOW.
    assertEquals(retrieval.validateConfiguration(ValidateConfigurationRequest.newBuilder().setTarget(direct)
        .setDeclarationsOnly(true).build()), retrieval.validateConfiguration(direct));
    assertTrue(retrieval.validateConfiguration(direct).valid());
    assertEquals(1, retrieval.validateConfiguration(ValidateConfigurationRequest.newBuilder().setTarget(direct)
        .build()).withReason("UNKNOWN_MODEL_WINDOW").size());
    Target bad = role(List.of(file("escape", SEARCH, "../../etc/passwd").build()), "escape", "missing-name");
    assertEquals(retrieval.validateConfiguration(ValidateConfigurationRequest.newBuilder().setTarget(bad)
        .setLlm(llm("test-model", 8000)).build()), retrieval.validateConfiguration(bad, llm("test-model", 8000)));
    assertFalse(retrieval.validateConfiguration(bad, llm("test-model", 8000)).valid());

    Map<String, Object> params = ordered("limit", 3, "question", "Which appliance can crush ice for a smoothie?");
    RetrievedContext byRequest = retrieval.enforce(enforce(List.of(PERSONA, PRODUCTS), "persona", "products")
        .addAllParams(params(params)).build());
    RetrievedContext plain = retrieval.enforce(role(List.of(PERSONA, PRODUCTS), "persona", "products"), "answer",
        params, llm("test-model", 8000));
    assertEquals(byRequest.query(), plain.query());
    assertEquals(chunkIds(byRequest), chunkIds(plain));
    assertEquals(List.of("persona", "products"), plain.blocks().stream().map(RetrievedContext.Block::source).toList());
    assertEquals("blender", plain.blocks().get(1).chunks().get(0).documentId());
    // No model: a DIRECT entry without max_tokens cannot be sized.
    assertEquals("UNKNOWN_MODEL_WINDOW", assertThrows(FailedPreconditionException.class,
        () -> retrieval.enforce(direct, "answer", Map.of(), null)).reason());

    Target sources = role(List.of(PRODUCTS, POLICY, PERSONA));
    assertEquals(retrieval.requireLoaded(RequireLoadedRequest.newBuilder().setTarget(sources)
        .addNames("products").addNames("policy").build()), retrieval.requireLoaded(sources, "products", "policy"));
    assertEquals(List.of("policy", "products"), List.copyOf(retrieval.requireLoaded(sources, "products", "policy")
        .keySet()));

    Target perRun = role(List.of(file("located", SEARCH, "").setReadiness(WHEN_CONFIGURED).build()));
    Map<String, String> paths = Map.of("located", "policy/shipping.txt");
    assertEquals(Map.of("located", 1), retrieval.requireReady(perRun, paths));
    assertEquals(retrieval.requireReady(RequireReadyRequest.newBuilder().setTarget(perRun)
        .putAllResolvedPaths(paths).build()), retrieval.requireReady(perRun, paths));
    assertEquals(Map.of(), retrieval.requireReady(perRun, Map.of()));

    Target searched = target(ROLE, List.of(PRODUCTS, POLICY));
    String question = "how many days do I have to return an item?";
    SearchResult found = retrieval.search(searched, question, 2);
    assertEquals(chunkIds(retrieval.search(SearchRequest.newBuilder().setTarget(searched).setQuery(question)
        .setTopK(2).build())), chunkIds(found));
    assertEquals("policy", found.hits().get(0).source());
    SearchOptions rerank = RetrievalRequests.rerank(null, RerankOrder.RERANK_ORDER_RERANKER);
    SearchResult reranked = retrieval.search(searched, "toast four slices of bread", 1, rerank);
    assertEquals(chunkIds(retrieval.search(SearchRequest.newBuilder().setTarget(searched)
        .setQuery("toast four slices of bread").setTopK(1).setSearch(rerank).build())), chunkIds(reranked));
    assertTrue(reranked.hits().stream().allMatch(h -> h.score() == h.rerankScore().getAsDouble()), reranked::toString);
    assertThrows(IllegalArgumentException.class, () -> retrieval.search(searched, question, 0));

    // The async overloads send the same requests.
    assertEquals(chunkIds(plain), chunkIds(retrieval.enforceAsync(role(List.of(PERSONA, PRODUCTS), "persona",
        "products"), "answer", params, llm("test-model", 8000)).join()));
    assertEquals(chunkIds(found), chunkIds(retrieval.searchAsync(searched, question, 2).join()));
    assertEquals(chunkIds(reranked), chunkIds(retrieval.searchAsync(searched, "toast four slices of bread", 1,
        rerank).join()));
    assertEquals(retrieval.validateConfiguration(direct), retrieval.validateConfigurationAsync(direct).join());
    assertEquals(retrieval.validateConfiguration(bad, llm("test-model", 8000)),
        retrieval.validateConfigurationAsync(bad, llm("test-model", 8000)).join());
    assertEquals(Map.of("products", PRODUCTS_JSONL.size()), retrieval.requireLoadedAsync(sources, "products").join());
    assertEquals(Map.of("located", 1), retrieval.requireReadyAsync(perRun, paths).join());
    // Unscoped, the overloads carry no principal, as a request without one.
    CompletionException unscoped = assertThrows(CompletionException.class,
        () -> client.retrieval().searchAsync(searched, question, 2).join());
    assertInstanceOf(PermissionDeniedException.class, unscoped.getCause());
  }

  @Test
  void actionKnowledgeOverridesTheDeclaredNames() {
    RetrievedContext context = retrieval.enforce(enforce(List.of(PERSONA, PRODUCTS), "persona")
        .setActionKnowledge(KnowledgeNames.newBuilder().addNames("products"))
        .addAllParams(params(ordered("q", "coffee beans"))).build());
    assertEquals(List.of("products"), context.blocks().stream().map(RetrievedContext.Block::source).toList());
    assertEquals("grinder", topDocument(context));
  }
}
