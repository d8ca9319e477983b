package io.ragsidecar.langchain4j;

import static io.ragsidecar.client.HostRerankers.answering;
import static io.ragsidecar.client.Products.OTHERS;
import static io.ragsidecar.client.Products.TOASTER;
import static io.ragsidecar.client.RetrievalRequests.document;
import static io.ragsidecar.client.RetrievalRequests.file;
import static io.ragsidecar.client.RetrievalRequests.memory;
import static io.ragsidecar.client.RetrievalRequests.target;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.langchain4j.data.message.UserMessage;
import dev.langchain4j.data.segment.TextSegment;
import dev.langchain4j.rag.AugmentationRequest;
import dev.langchain4j.rag.AugmentationResult;
import dev.langchain4j.rag.DefaultRetrievalAugmentor;
import dev.langchain4j.rag.RetrievalAugmentor;
import dev.langchain4j.rag.content.Content;
import dev.langchain4j.rag.content.ContentMetadata;
import dev.langchain4j.rag.content.aggregator.ReRankingContentAggregator;
import dev.langchain4j.rag.query.Metadata;
import dev.langchain4j.rag.query.Query;
import io.ragsidecar.client.HitDocument;
import io.ragsidecar.client.KnowledgeScope;
import io.ragsidecar.client.Products;
import io.ragsidecar.client.RagSidecarClient;
import io.ragsidecar.client.ReadmeExamples;
import io.ragsidecar.client.Reranker;
import io.ragsidecar.client.Sidecar;
import io.ragsidecar.client.SidecarExtension;
import io.ragsidecar.client.SidecarRetrieval;
import io.ragsidecar.client.UnknownModelException;
import io.ragsidecar.v1.KnowledgeEntry;
import io.ragsidecar.v1.KnowledgeUse;
import io.ragsidecar.v1.Target;
import java.io.IOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.io.TempDir;

/**
 * The adapter inside LangChain4j's own RAG pipeline (a {@link DefaultRetrievalAugmentor} with the
 * {@link SidecarContentRetriever} and a {@link ReRankingContentAggregator} over the {@link SidecarScoringModel}),
 * against the real sidecar with its real embedder and reranker.
 */
@ExtendWith(SidecarExtension.class)
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class LangChain4jPipelineTest {
  private static final KnowledgeUse SEARCH = KnowledgeUse.KNOWLEDGE_USE_SEARCH;
  private static final KnowledgeEntry PRODUCTS = file("products", SEARCH, "products.jsonl").setTopK(5).build();
  private static final KnowledgeEntry NOTES = memory("notes", SEARCH).build();
  private static final Target SHOP = target("com.acme.Shop", List.of(PRODUCTS, NOTES));

  /** What the README example uses, imported as a host imports it. */
  private static final String README_IMPORTS = """
      import dev.langchain4j.rag.DefaultRetrievalAugmentor;
      import dev.langchain4j.rag.RetrievalAugmentor;
      import dev.langchain4j.rag.content.aggregator.ReRankingContentAggregator;
      import io.ragsidecar.client.HitDocument;
import io.ragsidecar.client.KnowledgeScope;
      import io.ragsidecar.client.RagSidecarClient;
      import io.ragsidecar.client.RetrievalRequests;
      import io.ragsidecar.langchain4j.SidecarContentRetriever;
      import io.ragsidecar.langchain4j.SidecarScoringModel;
      import io.ragsidecar.v1.KnowledgeUse;
      import io.ragsidecar.v1.Target;
      import java.time.Duration;
      import java.util.List;""";

  private RagSidecarClient client;
  private SidecarRetrieval retrieval;
  private int port;

  @BeforeAll
  void start(@SidecarExtension.Options(ownKnowledge = true) Sidecar sidecar) throws IOException {
    Products.write(sidecar.knowledgeRoot());
    port = sidecar.port();
    client = sidecar.clientBuilder().defaultDeadline(Duration.ofSeconds(120)).awaitReady(Duration.ofSeconds(60))
        .build();
    retrieval = client.retrieval().withScope(new KnowledgeScope("agent-host", "acme", "lc4j"));
    retrieval.upsertDocuments("notes", List.of(
        document("n1", "The customer Bob prefers delivery on Saturdays.", Map.of("author", "ada"))));
  }

  @AfterAll
  void stop() {
    client.close();
  }

  private static AugmentationResult augment(RetrievalAugmentor augmentor, String question) {
    UserMessage message = UserMessage.from(question);
    return augmentor.augment(new AugmentationRequest(message, Metadata.from(message, "chat-1", List.of())));
  }

  @Test
  void augmentorRetrievesThroughSearchAndKeepsTheRerankersTopOne() {
    SidecarContentRetriever retriever = SidecarContentRetriever.builder().retrieval(retrieval).target(SHOP)
        .knowledge("products").build();
    RetrievalAugmentor augmentor = DefaultRetrievalAugmentor.builder().contentRetriever(retriever)
        .contentAggregator(ReRankingContentAggregator.builder().scoringModel(SidecarScoringModel.of(client.reranker()))
            .maxResults(1).build())
        .build();

    AugmentationResult result = augment(augmentor, "toast four slices of bread");

    assertEquals(1, result.contents().size());
    Content top = result.contents().get(0);
    assertEquals(TOASTER, top.textSegment().text());
    assertEquals("products", top.textSegment().metadata().getString("source"));
    assertEquals("toaster", top.textSegment().metadata().getString("document_id"));
    assertFalse(top.textSegment().metadata().getString(HitDocument.CHUNK_ID).isEmpty(), top::toString);
    double reranked = (Double) top.metadata().get(ContentMetadata.RERANKED_SCORE);
    assertTrue(reranked > 0.5 && reranked <= 1.0, "reranked score " + reranked);
    String augmented = ((UserMessage) result.chatMessage()).singleText();
    assertTrue(augmented.startsWith("toast four slices of bread"), augmented);
    assertTrue(augmented.contains(TOASTER), augmented);
    assertTrue(OTHERS.stream().noneMatch(augmented::contains), augmented);
  }

  /**
   * The README's example as written (on the test sidecar's port): its augmentor puts the toaster first, with the
   * reranker's relevance under RERANKED_SCORE and no SCORE, as the README says.
   */
  @Test
  void theReadmeExampleAugmentsWithTheRerankedScore(@TempDir Path out) throws ReflectiveOperationException {
    List<ReadmeExamples.Block> blocks = ReadmeExamples.javaBlocks(ReadmeExamples.readme());
    assertEquals(2, blocks.size(), "the README's java blocks");
    String unit = ReadmeExamples.unit(README_IMPORTS, ReadmeExamples.onPort(blocks.get(0), port),
        "public final class LangChain4jExample {\n  public static RetrievalAugmentor augmentor() {\n"
            + ReadmeExamples.EXAMPLE + "\n    return augmentor;\n  }\n}");
    RetrievalAugmentor augmentor = (RetrievalAugmentor) ReadmeExamples
        .compile(Map.of("readme.LangChain4jExample", unit), out).loadClass("readme.LangChain4jExample")
        .getMethod("augmentor").invoke(null);

    Content top = augment(augmentor, "toast four slices of bread").contents().get(0);

    assertEquals(TOASTER, top.textSegment().text());
    assertTrue(top.metadata().get(ContentMetadata.RERANKED_SCORE) instanceof Double, top.metadata()::toString);
    assertFalse(top.metadata().containsKey(ContentMetadata.SCORE), top.metadata()::toString);
  }

  @Test
  void theDependencySnippetNamesThisVersion() {
    ReadmeExamples.assertDependencyVersions(ReadmeExamples.readme(), System.getProperty("ragsidecar.version"));
  }

  @Test
  void retrieverSearchesMemoryDocumentsInItsScope() {
    SidecarContentRetriever retriever = SidecarContentRetriever.builder().retrieval(retrieval).target(SHOP)
        .knowledge("notes").build();
    List<Content> contents = DefaultRetrievalAugmentor.builder().contentRetriever(retriever).build()
        .augment(new AugmentationRequest(UserMessage.from("when does Bob want his delivery?"),
            Metadata.from(UserMessage.from("when does Bob want his delivery?"), "chat-2", List.of())))
        .contents();
    assertEquals(List.of("n1"), contents.stream().map(c -> c.textSegment().metadata().getString("document_id"))
        .toList());
    assertTrue(contents.get(0).metadata().get(ContentMetadata.SCORE) instanceof Double);

    SidecarRetrieval otherTenant = client.retrieval().withScope(new KnowledgeScope("agent-host", "globex", "lc4j"));
    assertEquals(List.of(), SidecarContentRetriever.builder().retrieval(otherTenant).target(SHOP).knowledge("notes")
        .build().retrieve(Query.from("when does Bob want his delivery?")));
  }

  @Test
  void topNAppliesAfterScoringEveryCandidate() {
    // The retrieval order puts the relevant document last; the aggregator's top 1 must still be it.
    List<Content> candidates = new ArrayList<>();
    OTHERS.forEach(text -> candidates.add(Content.from(text)));
    candidates.add(Content.from(TOASTER));
    Query query = Query.from("toast four slices of bread");
    Map<Query, Collection<List<Content>>> retrieved = Map.of(query, List.of(candidates));

    List<Content> top = ReRankingContentAggregator.builder().scoringModel(SidecarScoringModel.of(client.reranker()))
        .maxResults(1).build().aggregate(retrieved);

    assertEquals(List.of(TOASTER), top.stream().map(c -> c.textSegment().text()).toList());
  }

  @Test
  void scoresReferenceEachGivenSegmentOnceInOrder() {
    List<TextSegment> segments = List.of(TextSegment.from(OTHERS.get(0)), TextSegment.from(TOASTER),
        TextSegment.from(OTHERS.get(0)));
    List<Double> scores = SidecarScoringModel.builder().reranker(client.reranker()).model("ms-marco-MiniLM-L-12-v2")
        .build().scoreAll(segments, "toast four slices of bread").content();
    assertEquals(3, scores.size());
    assertTrue(scores.get(1) > scores.get(0), scores::toString);
    assertEquals(scores.get(0), scores.get(2), 1e-6, "the same text scores the same wherever it is");
    assertTrue(scores.stream().allMatch(s -> s >= 0.0 && s <= 1.0), scores::toString);
  }

  @Test
  void aHostRerankerThatAnswersADocumentNotGivenFailsClearly() {
    // A host's own Reranker that references a third document when given two.
    Reranker outOfRange = answering(2);
    IllegalStateException broken = assertThrows(IllegalStateException.class, () -> SidecarScoringModel.of(outOfRange)
        .scoreAll(List.of(TextSegment.from(TOASTER), TextSegment.from(OTHERS.get(0))), "toast"));
    assertTrue(broken.getMessage().contains("index 2") && broken.getMessage().contains("2 documents"),
        broken.getMessage());
  }

  @Test
  void unknownModelFailsClearly() {
    SidecarScoringModel model = SidecarScoringModel.builder().reranker(client.reranker()).model("no-such-model")
        .build();
    UnknownModelException e = assertThrows(UnknownModelException.class,
        () -> model.scoreAll(List.of(TextSegment.from(TOASTER)), "toast"));
    assertEquals("no-such-model", e.model());
  }

  @Test
  void emptyResultFromNonEmptyInputIsLogged() {
    List<LogRecord> records = new ArrayList<>();
    Handler capture = new Handler() {
      @Override
      public void publish(LogRecord record) {
        records.add(record);
      }

      @Override
      public void flush() {}

      @Override
      public void close() {}
    };
    Logger logger = Logger.getLogger(SidecarScoringModel.class.getName());
    logger.addHandler(capture);
    try {
      SidecarScoringModel strict = SidecarScoringModel.builder().reranker(client.reranker())
          .minRelevanceScore(0.99f).build();
      List<Double> scores = strict.scoreAll(List.of(TextSegment.from(OTHERS.get(0)),
          TextSegment.from(OTHERS.get(1))), "toast four slices of bread").content();
      assertEquals(List.of(0.0, 0.0), scores);
      assertFalse(records.isEmpty(), "no log record");
      assertEquals(Level.WARNING, records.get(0).getLevel());
      assertTrue(records.get(0).getMessage().contains("returned no result"), records.get(0).getMessage());
      records.clear();
      strict.scoreAll(List.of(), "anything");
      assertEquals(List.of(), records, "an empty input is not worth a warning");
    } finally {
      logger.removeHandler(capture);
    }
  }
}
