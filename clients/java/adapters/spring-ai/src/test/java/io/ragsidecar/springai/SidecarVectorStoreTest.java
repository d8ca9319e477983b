package io.ragsidecar.springai;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.ragsidecar.client.KnowledgeScope;
import io.ragsidecar.client.RagSidecarClient;
import io.ragsidecar.client.ReadmeExamples;
import io.ragsidecar.client.Sidecar;
import io.ragsidecar.client.SidecarExtension;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.Date;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.io.TempDir;
import org.springframework.ai.chat.client.ChatClient;
import org.springframework.ai.chat.client.advisor.vectorstore.VectorStoreChatMemoryAdvisor;
import org.springframework.ai.chat.memory.ChatMemory;
import org.springframework.ai.chat.messages.AssistantMessage;
import org.springframework.ai.chat.model.ChatModel;
import org.springframework.ai.chat.model.ChatResponse;
import org.springframework.ai.chat.model.Generation;
import org.springframework.ai.chat.prompt.Prompt;
import org.springframework.ai.document.Document;
import org.springframework.ai.vectorstore.SearchRequest;
import org.springframework.ai.vectorstore.VectorStore;
import org.springframework.ai.vectorstore.filter.Filter;
import org.springframework.ai.vectorstore.filter.FilterExpressionBuilder;

/**
 * {@link SidecarVectorStore} through Spring AI's own API ({@link VectorStore}, {@link SearchRequest}, filter
 * expressions, {@link VectorStoreChatMemoryAdvisor} run by a {@link ChatClient}) against the real sidecar and its
 * real embedder. Each test writes in a tenant of its own.
 */
@ExtendWith(SidecarExtension.class)
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class SidecarVectorStoreTest {
  private static final AtomicInteger TENANTS = new AtomicInteger();
  private static final String README_IMPORTS = """
      import io.ragsidecar.client.KnowledgeScope;
      import io.ragsidecar.client.RagSidecarClient;
      import io.ragsidecar.springai.SidecarVectorStore;
      import java.time.Duration;
      import java.util.List;
      import java.util.Map;
      import org.springframework.ai.chat.client.ChatClient;
      import org.springframework.ai.chat.client.advisor.vectorstore.VectorStoreChatMemoryAdvisor;
      import org.springframework.ai.chat.memory.ChatMemory;
      import org.springframework.ai.chat.model.ChatModel;
      import org.springframework.ai.document.Document;
      import org.springframework.ai.vectorstore.SearchRequest;
      import org.springframework.ai.vectorstore.VectorStore;""";

  private RagSidecarClient client;

  @BeforeAll
  void start(@SidecarExtension.Options(ownKnowledge = true) Sidecar sidecar) {
    client = sidecar.clientBuilder().defaultDeadline(Duration.ofSeconds(120)).build();
  }

  @AfterAll
  void stop() {
    client.close();
  }

  private VectorStore store() {
    return SidecarVectorStore.builder(client).knowledge("notes")
        .scope(new KnowledgeScope("agent-host", "spring-store-" + TENANTS.incrementAndGet(), "s1")).build();
  }

  /** A stand-in for an LLM: it answers with the prompt it was given, so the test reads what the advisor built. */
  private static final class EchoChatModel implements ChatModel {
    @Override
    public ChatResponse call(Prompt prompt) {
      return new ChatResponse(List.of(new Generation(new AssistantMessage(prompt.getContents()))));
    }
  }

  private static final String KETTLE = String.join(" ", java.util.Collections.nCopies(60,
      "The kettle boils water for tea in the kitchen within three minutes."));

  private static List<Document> household() {
    return List.of(
        Document.builder().id("kettle").text(KETTLE).metadata(Map.of("room", "kitchen", "watts", 2200,
            "smart", false, "tags", List.of("appliance", "hot"), "bought", Instant.parse("2025-03-01T10:00:00Z")))
            .build(),
        Document.builder().id("toaster").text("The toaster browns four slices of bread for breakfast.")
            .metadata(Map.of("room", "kitchen", "watts", 900, "smart", true, "tags", List.of("appliance"))).build(),
        Document.builder().id("mower").text("The lawn mower cuts the grass in the garden on Saturdays.")
            .metadata(Map.of("room", "garden", "watts", 1200, "smart", false)).build());
  }

  private static List<String> ids(List<Document> documents) {
    return documents.stream().map(Document::getId).toList();
  }

  @Test
  void searchGivesEachDocumentOnceWithItsTextTypedMetadataAndSimilarity() {
    VectorStore store = store();
    store.add(household());

    List<Document> found = store.similaritySearch(SearchRequest.builder().query("boil water for tea").topK(3)
        .build());
    assertEquals(3, found.size(), found::toString);
    assertEquals("kettle", found.get(0).getId());
    assertEquals(3, ids(found).stream().distinct().count(), "a document split into chunks comes back once");
    Document kettle = found.get(0);
    assertEquals(KETTLE, kettle.getText());
    assertEquals(Map.of("room", "kitchen", "watts", 2200.0, "smart", false, "tags", List.of("appliance", "hot"),
        "bought", Instant.parse("2025-03-01T10:00:00Z")), kettle.getMetadata());
    assertTrue(kettle.getScore() > 0.3 && kettle.getScore() <= 1.0, found::toString);
    assertTrue(kettle.getScore() >= found.get(1).getScore(), found::toString);

    // similarityThreshold is the cosine similarity each document's score shows.
    double cut = (kettle.getScore() + found.get(1).getScore()) / 2;
    assertEquals(List.of("kettle"), ids(store.similaritySearch(SearchRequest.builder().query("boil water for tea")
        .topK(3).similarityThreshold(cut).build())));
  }

  @Test
  void textAndBuiltFilterExpressionsSelectByTypedMetadata() {
    VectorStore store = store();
    store.add(household());
    String query = "household appliance";

    assertEquals(List.of("kettle", "toaster"), sorted(search(store, query, "room == 'kitchen'")));
    assertEquals(List.of("kettle"), sorted(search(store, query, "room == 'kitchen' && watts >= 1000")));
    assertEquals(List.of("mower", "toaster"), sorted(search(store, query, "smart == true || room == 'garden'")));
    assertEquals(List.of("kettle", "toaster"), sorted(search(store, query, "tags in ['appliance', 'tool']")));
    assertEquals(List.of("mower"), sorted(search(store, query, "tags not in ['appliance']")));
    assertEquals(List.of("mower"), sorted(search(store, query, "NOT (room == 'kitchen')")));
    assertEquals(List.of("toaster"), sorted(search(store, query, "watts < 1000 && watts > 500")));

    FilterExpressionBuilder b = new FilterExpressionBuilder();
    assertEquals(List.of("kettle"), sorted(store.similaritySearch(SearchRequest.builder().query(query).topK(5)
        .filterExpression(b.and(b.gte("bought", Date.from(Instant.parse("2025-01-01T00:00:00Z"))),
            b.isNotNull("tags")).build()).build())));
    assertEquals(List.of("mower"), sorted(store.similaritySearch(SearchRequest.builder().query(query).topK(5)
        .filterExpression(b.isNull("tags").build()).build())));

    // A blank query lists what the filter keeps, by id, unscored.
    List<Document> listed = store.similaritySearch(SearchRequest.builder().query("").topK(5)
        .filterExpression("room == 'kitchen'").build());
    assertEquals(List.of("kettle", "toaster"), ids(listed));
    assertNull(listed.get(0).getScore());
  }

  @Test
  void whatCannotBeTranslatedFailsClearly() {
    VectorStore store = store();
    Filter.Expression nested = new Filter.Expression(Filter.ExpressionType.EQ, new Filter.Key("room"),
        new Filter.Value(Map.of("a", 1)));
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> store.similaritySearch(SearchRequest.builder().query("x").filterExpression(nested).build()));
    assertTrue(e.getMessage().contains("cannot translate") && e.getMessage().contains("room"), e.getMessage());

    IllegalArgumentException metadata = assertThrows(IllegalArgumentException.class, () -> store.add(List.of(
        Document.builder().id("bad").text("t").metadata(Map.of("nested", Map.of("a", 1))).build())));
    assertTrue(metadata.getMessage().contains("nested"), metadata.getMessage());
  }

  @Test
  void deleteByIdsAndByFilterExpression() {
    VectorStore store = store();
    store.add(household());
    store.delete(List.of("toaster"));
    assertEquals(List.of("kettle", "mower"), ids(listAll(store)));
    store.delete("room == 'garden'");
    assertEquals(List.of("kettle"), ids(listAll(store)));
    store.delete(new FilterExpressionBuilder().eq("room", "kitchen").build());
    assertEquals(List.of(), ids(listAll(store)));
  }

  @Test
  void expiredDocumentsAreNotFound() {
    VectorStore store = store();
    store.add(List.of(Document.builder().id("old").text("The kettle boils water.")
            .metadata(Map.of(SidecarVectorStore.EXPIRES_AT, Instant.now().minusSeconds(5))).build(),
        Document.builder().id("new").text("The kettle boils water quickly.")
            .metadata(Map.of(SidecarVectorStore.EXPIRES_AT, Instant.now().plusSeconds(3600))).build()));
    List<Document> found = store.similaritySearch(SearchRequest.builder().query("kettle").topK(5).build());
    assertEquals(List.of("new"), ids(found));
    assertTrue(found.get(0).getMetadata().get(SidecarVectorStore.EXPIRES_AT) instanceof Instant, found::toString);
  }

  @Test
  void vectorStoreChatMemoryAdvisorRemembersPerConversation() {
    VectorStore store = store();
    ChatClient chat = ChatClient.builder(new EchoChatModel())
        .defaultAdvisors(VectorStoreChatMemoryAdvisor.builder(store).build()).build();

    chat.prompt().user("My cat is called Miso and she likes sardines.")
        .advisors(a -> a.param(ChatMemory.CONVERSATION_ID, "alice")).call().content();
    chat.prompt().user("My dog is called Rex.")
        .advisors(a -> a.param(ChatMemory.CONVERSATION_ID, "bob")).call().content();

    String alice = chat.prompt().user("What is my cat called?")
        .advisors(a -> a.param(ChatMemory.CONVERSATION_ID, "alice")).call().content();
    assertTrue(alice.contains("Miso"), alice);
    assertTrue(!alice.contains("Rex"), alice);   // the advisor's conversationId filter, applied by the sidecar

    // What the advisor wrote: each user and assistant message, tagged with its conversation.
    List<Document> written = store.similaritySearch(SearchRequest.builder().query("").topK(20)
        .filterExpression("conversationId == 'bob'").build());
    assertTrue(written.stream().anyMatch(d -> d.getText().equals("My dog is called Rex.")
        && "USER".equals(d.getMetadata().get("messageType"))), written::toString);
  }

  @Test
  void theReadmeStoreExampleRuns(@TempDir Path out) throws ReflectiveOperationException {
    List<ReadmeExamples.Block> blocks = ReadmeExamples.javaBlocks(ReadmeExamples.readme());
    ReadmeExamples.Block block = blocks.stream().filter(b -> b.body().contains("SidecarVectorStore.builder"))
        .findFirst().orElseThrow();
    String unit = ReadmeExamples.unit(README_IMPORTS, block,
        "public final class StoreExample {\n  public static Object run(RagSidecarClient client, ChatModel chatModel,"
            + " String question) {\n" + ReadmeExamples.EXAMPLE + "\n    return List.of(found, reply);\n  }\n}");
    ClassLoader example = ReadmeExamples.compile(Map.of("readme.StoreExample", unit), out);
    List<?> result = (List<?>) example.loadClass("readme.StoreExample")
        .getMethod("run", RagSidecarClient.class, ChatModel.class, String.class)
        .invoke(null, client, new EchoChatModel(), "When should Bob's parcels arrive?");
    List<?> found = (List<?>) result.get(0);
    assertEquals("n1", ((Document) found.get(0)).getId());
    assertEquals(2.0, ((Document) found.get(0)).getMetadata().get("priority"));
    assertTrue(((String) result.get(1)).contains("Bob prefers Saturday delivery."), (String) result.get(1));
  }

  private static List<String> search(VectorStore store, String query, String filter) {
    return ids(store.similaritySearch(SearchRequest.builder().query(query).topK(5).filterExpression(filter).build()));
  }

  private static List<String> sorted(List<?> items) {
    return items.stream().map(i -> i instanceof Document d ? d.getId() : (String) i).sorted().toList();
  }

  private static List<Document> listAll(VectorStore store) {
    return store.similaritySearch(SearchRequest.builder().query(" ").topK(100).build());
  }
}
