package io.ragsidecar.springai;

import static io.ragsidecar.client.HostRerankers.answering;
import static io.ragsidecar.client.RetrievalRequests.directory;
import static io.ragsidecar.client.RetrievalRequests.file;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.ragsidecar.client.KnowledgeScope;
import io.ragsidecar.client.Products;
import io.ragsidecar.client.RagSidecarClient;
import io.ragsidecar.client.ReadmeExamples;
import io.ragsidecar.client.Reranker;
import io.ragsidecar.client.Sidecar;
import io.ragsidecar.client.SidecarExtension;
import io.ragsidecar.client.UnknownModelException;
import io.ragsidecar.v1.KnowledgeEntry;
import io.ragsidecar.v1.KnowledgeUse;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.logging.Logger;
import java.util.logging.SimpleFormatter;
import java.util.logging.StreamHandler;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.io.TempDir;
import org.springframework.ai.chat.client.ChatClient;
import org.springframework.ai.chat.messages.AssistantMessage;
import org.springframework.ai.chat.model.ChatModel;
import org.springframework.ai.chat.model.ChatResponse;
import org.springframework.ai.chat.model.Generation;
import org.springframework.ai.chat.prompt.Prompt;
import org.springframework.ai.document.Document;
import org.springframework.ai.rag.Query;
import org.springframework.ai.rag.advisor.RetrievalAugmentationAdvisor;

/**
 * The adapter inside Spring AI's own RAG pipeline ({@link RetrievalAugmentationAdvisor} run by a {@link ChatClient})
 * against the real sidecar, with its real embedder and reranker, on real knowledge files.
 */
@ExtendWith(SidecarExtension.class)
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class SidecarSpringAiTest {
  private static final String ROLE = "com.acme.SupportRole";
  private static final KnowledgeScope SCOPE = new KnowledgeScope("agent-host", "acme", "s1");
  private static final KnowledgeUse SEARCH = KnowledgeUse.KNOWLEDGE_USE_SEARCH;
  private static final KnowledgeEntry PRODUCTS = file("products", SEARCH, "products.jsonl").build();
  private static final KnowledgeEntry POLICY = directory("policy", SEARCH, "policy").build();

  /** What the README example uses, imported as a host imports it. */
  private static final String README_IMPORTS = """
      import io.ragsidecar.client.KnowledgeScope;
      import io.ragsidecar.client.RagSidecarClient;
      import io.ragsidecar.client.RetrievalRequests;
      import io.ragsidecar.springai.SidecarDocumentPostProcessor;
      import io.ragsidecar.springai.SidecarDocumentRetriever;
      import io.ragsidecar.v1.KnowledgeEntry;
      import io.ragsidecar.v1.KnowledgeUse;
      import java.time.Duration;
      import java.util.List;
      import org.springframework.ai.chat.client.ChatClient;
      import org.springframework.ai.chat.model.ChatModel;
      import org.springframework.ai.rag.advisor.RetrievalAugmentationAdvisor;""";

  private RagSidecarClient client;
  private SidecarDocumentRetriever retriever;
  private int port;

  @BeforeAll
  void start(@SidecarExtension.Options(ownKnowledge = true) Sidecar sidecar) throws IOException {
    Path root = sidecar.knowledgeRoot();
    Products.write(root);
    write(root, "policy/returns.md", "# Returns policy\n\nItems can be returned within 30 days of delivery.\n");
    port = sidecar.port();
    client = sidecar.clientBuilder().defaultDeadline(Duration.ofSeconds(120)).build();
    retriever = SidecarDocumentRetriever.builder(client.retrieval().withScope(SCOPE), ROLE, List.of(PRODUCTS, POLICY))
        .topK(5).build();
  }

  @AfterAll
  void stop() {
    client.close();
  }

  private static void write(Path root, String relative, String text) throws IOException {
    Path path = root.resolve(relative);
    Files.createDirectories(path.getParent());
    Files.writeString(path, text, StandardCharsets.UTF_8);
  }

  /** A stand-in for an LLM: it answers with the prompt it was given, so the test reads what the advisor built. */
  private static final class EchoChatModel implements ChatModel {
    @Override
    public ChatResponse call(Prompt prompt) {
      return new ChatResponse(List.of(new Generation(new AssistantMessage(prompt.getContents()))));
    }
  }

  @Test
  void advisorPutsTheSidecarsDocumentsIntoThePromptReranked() {
    String question = "Which appliance toasts four slices of bread?";
    RetrievalAugmentationAdvisor advisor = RetrievalAugmentationAdvisor.builder().documentRetriever(retriever)
        .documentPostProcessors(SidecarDocumentPostProcessor.builder(client).topN(2).build()).build();
    ChatClient chat = ChatClient.builder(new EchoChatModel()).defaultAdvisors(advisor).build();

    ChatResponse response = chat.prompt().user(question).call().chatResponse();
    String prompt = response.getResult().getOutput().getText();
    List<Document> context = response.getMetadata().get(RetrievalAugmentationAdvisor.DOCUMENT_CONTEXT);

    // The retriever found more than the reranker kept; the two kept are the reranker's best two, in its order.
    List<Document> retrieved = retriever.retrieve(new Query(question));
    assertTrue(retrieved.size() > 2, retrieved::toString);
    List<String> bestTwo = client.reranker().rerank(Reranker.Request.builder().query(question)
            .documents(retrieved.stream().map(d -> Reranker.Document.of("", d.getText())).toList()).build())
        .stream().limit(2).map(r -> retrieved.get(r.index()).getText()).toList();
    assertEquals(bestTwo, context.stream().map(Document::getText).toList());
    assertEquals(Products.BY_ID.get("toaster"), bestTwo.get(0));
    assertEquals("toaster", context.get(0).getMetadata().get(SidecarDocumentRetriever.DOCUMENT_ID));
    assertTrue(context.get(0).getScore() >= context.get(1).getScore(), context::toString);

    assertTrue(prompt.contains(question), prompt);
    assertTrue(prompt.indexOf(bestTwo.get(0)) >= 0, prompt);
    assertTrue(prompt.indexOf(bestTwo.get(0)) < prompt.indexOf(bestTwo.get(1)), prompt);
    retrieved.stream().map(Document::getText).filter(text -> !bestTwo.contains(text))
        .forEach(dropped -> assertFalse(prompt.contains(dropped), dropped));
  }

  /**
   * The README's example as written (on the test sidecar's port), with the echo model: it answers from the reranked
   * products, and leaves no thread that would keep a plain {@code main} from exiting.
   */
  @Test
  void theReadmeExampleAnswersAndLeavesNoThreadBehind(@TempDir Path out) throws ReflectiveOperationException {
    List<ReadmeExamples.Block> blocks = ReadmeExamples.javaBlocks(ReadmeExamples.readme());
    assertEquals(2, blocks.size(), "the README's java blocks");
    String unit = ReadmeExamples.unit(README_IMPORTS, ReadmeExamples.onPort(blocks.get(0), port),
        "public final class SpringAiExample {\n  public static String answer(ChatModel chatModel, String question) {\n"
            + ReadmeExamples.EXAMPLE + "\n    return answer;\n  }\n}");
    ClassLoader example = ReadmeExamples.compile(Map.of("readme.SpringAiExample", unit), out);
    Set<Thread> before = Thread.getAllStackTraces().keySet();

    String answer = (String) example.loadClass("readme.SpringAiExample").getMethod("answer", ChatModel.class,
        String.class).invoke(null, new EchoChatModel(), "Which appliance toasts four slices of bread?");

    assertTrue(answer.contains(Products.BY_ID.get("toaster")), answer);
    List<String> left = Thread.getAllStackTraces().keySet().stream()
        .filter(t -> !before.contains(t) && t.isAlive() && !t.isDaemon()).map(Thread::getName).toList();
    assertEquals(List.of(), left, "threads that keep a plain main from exiting");
  }

  @Test
  void theDependencySnippetNamesThisVersion() {
    ReadmeExamples.assertDependencyVersions(ReadmeExamples.readme(), System.getProperty("ragsidecar.version"));
  }

  @Test
  void retrieverMapsHitsOfTheNamedKnowledgeToDocuments() {
    List<Document> products = SidecarDocumentRetriever.builder(client.retrieval().withScope(SCOPE), ROLE,
        List.of(PRODUCTS, POLICY)).knowledge("products").topK(3).build()
        .retrieve(new Query("grind coffee beans"));
    assertEquals(3, products.size(), products::toString);
    assertEquals("grinder", products.get(0).getMetadata().get(SidecarDocumentRetriever.DOCUMENT_ID));
    for (Document d : products) {
      assertEquals("products", d.getMetadata().get(SidecarDocumentRetriever.SOURCE));
      assertEquals("products.jsonl", d.getMetadata().get(SidecarDocumentRetriever.FILE));
      assertFalse(d.getId().isEmpty());
      assertEquals(d.getId(), d.getMetadata().get(SidecarDocumentRetriever.CHUNK_ID));
    }
    assertTrue(products.get(0).getScore() >= products.get(2).getScore(), products::toString);

    List<Document> policy = retriever.retrieve(new Query("how many days do I have to return an item?"));
    assertEquals("policy", policy.get(0).getMetadata().get(SidecarDocumentRetriever.SOURCE));
    assertTrue(policy.get(0).getText().contains("30 days"), policy::toString);
  }

  @Test
  void rerankingKeepsTopNOfTheGivenDocumentsEachOnceAfterScoring() {
    // The best document comes last and two documents share an id, as joined results of several retrievers may.
    List<Document> given = new ArrayList<>();
    Products.BY_ID.forEach((id, text) -> {
      if (!id.equals("grinder")) {
        given.add(Document.builder().id("same-id").text(text).build());
      }
    });
    given.add(Document.builder().id("grinder").text(Products.BY_ID.get("grinder")).build());
    Query query = new Query("grind coffee beans");

    List<Document> one = SidecarDocumentPostProcessor.builder(client).topN(1).build().process(query, given);
    assertEquals(List.of("grinder"), one.stream().map(Document::getId).toList());

    List<Document> three = SidecarDocumentPostProcessor.builder(client).topN(3).build().process(query, given);
    assertEquals(3, three.size());
    assertEquals(3, three.stream().map(Document::getText).distinct().count());
    assertTrue(three.stream().allMatch(d -> Products.BY_ID.containsValue(d.getText())));
    assertEquals(three.stream().sorted(Comparator.comparing(Document::getScore).reversed()).toList(), three);

    assertEquals(given.size(), SidecarDocumentPostProcessor.builder(client).build().process(query, given).size());
    assertEquals(List.of(), SidecarDocumentPostProcessor.builder(client).build().process(query, List.of()));
    // Reranking disabled: the no-op reranker keeps the given order, cut to topN, and the documents as they were.
    assertEquals(given.subList(0, 2),
        SidecarDocumentPostProcessor.builder(Reranker.noOp()).topN(2).build().process(query, given));
  }

  @Test
  void anUnknownModelFailsClearly() {
    UnknownModelException unknown = assertThrows(UnknownModelException.class,
        () -> SidecarDocumentPostProcessor.builder(client).model("no-such-reranker").build()
            .process(new Query("bread"), List.of(new Document("The Toaster T4 browns bread."))));
    assertEquals("no-such-reranker", unknown.model());
  }

  @Test
  void anEmptyResultOfANonEmptyInputIsLogged() {
    ByteArrayOutputStream log = new ByteArrayOutputStream();
    StreamHandler capture = new StreamHandler(log, new SimpleFormatter());
    Logger logger = Logger.getLogger(SidecarDocumentPostProcessor.class.getName());
    logger.addHandler(capture);
    try {
      SidecarDocumentPostProcessor strict = SidecarDocumentPostProcessor.builder(client).minRelevanceScore(0.9999f)
          .build();
      assertEquals(List.of(), strict.process(new Query("toast four slices of bread"), List.of()));
      capture.flush();
      assertEquals("", log.toString(StandardCharsets.UTF_8));

      List<Document> none = strict.process(new Query("toast four slices of bread"),
          List.of(new Document("Penguins live in the southern hemisphere."), new Document("Granite is a rock.")));
      assertEquals(List.of(), none);
      capture.flush();
      String logged = log.toString(StandardCharsets.UTF_8);
      assertTrue(logged.contains("WARNING") && logged.contains("kept none of 2 documents"), logged);
    } finally {
      logger.removeHandler(capture);
    }
  }

  @Test
  void aRerankerThatBreaksTheSpiFailsTheCall() {
    // A host's own Reranker implementation that answers one document twice: the adapter refuses the answer.
    Reranker twice = answering(0, 0);
    IllegalStateException broken = assertThrows(IllegalStateException.class,
        () -> SidecarDocumentPostProcessor.builder(twice).build()
            .process(new Query("bread"), List.of(new Document("a"), new Document("b"))));
    assertTrue(broken.getMessage().contains("twice"), broken.getMessage());

    // One that references a third document when given two.
    Reranker outOfRange = answering(2);
    broken = assertThrows(IllegalStateException.class, () -> SidecarDocumentPostProcessor.builder(outOfRange).build()
        .process(new Query("bread"), List.of(new Document("a"), new Document("b"))));
    assertTrue(broken.getMessage().contains("index 2") && broken.getMessage().contains("2 documents"),
        broken.getMessage());
  }
}
