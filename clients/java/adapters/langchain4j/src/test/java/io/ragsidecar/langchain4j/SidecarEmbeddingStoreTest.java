package io.ragsidecar.langchain4j;

import static dev.langchain4j.store.embedding.filter.MetadataFilterBuilder.metadataKey;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.langchain4j.data.document.Metadata;
import dev.langchain4j.data.embedding.Embedding;
import dev.langchain4j.data.segment.TextSegment;
import dev.langchain4j.rag.content.Content;
import dev.langchain4j.rag.content.retriever.EmbeddingStoreContentRetriever;
import dev.langchain4j.rag.query.Query;
import dev.langchain4j.store.embedding.EmbeddingMatch;
import dev.langchain4j.store.embedding.EmbeddingSearchRequest;
import dev.langchain4j.store.embedding.EmbeddingStore;
import dev.langchain4j.store.embedding.filter.Filter;
import io.ragsidecar.client.KnowledgeScope;
import io.ragsidecar.client.RagSidecarClient;
import io.ragsidecar.client.ReadmeExamples;
import io.ragsidecar.client.Sidecar;
import java.net.URI;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@link SidecarEmbeddingStore} and {@link SidecarEmbeddingModel} through LangChain4j's own API
 * ({@link EmbeddingStore}, {@link EmbeddingStoreContentRetriever} with a {@link Filter}) against a real sidecar
 * serving gRPC and its HTTP API, with its real embedder. Each test writes in a tenant of its own.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class SidecarEmbeddingStoreTest {
  private static final AtomicInteger TENANTS = new AtomicInteger();
  private static final String README_IMPORTS = """
      import static dev.langchain4j.store.embedding.filter.MetadataFilterBuilder.metadataKey;
      import dev.langchain4j.data.document.Metadata;
      import dev.langchain4j.data.segment.TextSegment;
      import dev.langchain4j.model.embedding.EmbeddingModel;
      import dev.langchain4j.rag.content.Content;
      import dev.langchain4j.rag.content.retriever.ContentRetriever;
      import dev.langchain4j.rag.content.retriever.EmbeddingStoreContentRetriever;
      import dev.langchain4j.rag.query.Query;
      import dev.langchain4j.store.embedding.EmbeddingStore;
      import io.ragsidecar.client.KnowledgeScope;
      import io.ragsidecar.client.RagSidecarClient;
      import io.ragsidecar.langchain4j.SidecarEmbeddingModel;
      import io.ragsidecar.langchain4j.SidecarEmbeddingStore;
      import java.net.URI;
      import java.util.List;
      import java.util.Map;""";

  private Sidecar sidecar;
  private RagSidecarClient client;
  private SidecarEmbeddingModel embedder;

  @BeforeAll
  void start() {
    sidecar = Sidecar.startWithHttp();
    client = sidecar.clientBuilder().defaultDeadline(Duration.ofSeconds(120)).build();
    embedder = SidecarEmbeddingModel.builder(URI.create(sidecar.httpUrl()), "bge-small-en-v1.5").build();
  }

  @AfterAll
  void stop() {
    client.close();
    sidecar.close();
  }

  private SidecarEmbeddingStore store() {
    return SidecarEmbeddingStore.builder(client).knowledge("notes")
        .scope(new KnowledgeScope("agent-host", "lc4j-store-" + TENANTS.incrementAndGet(), "s1")).build();
  }

  private static final String KETTLE = String.join(" ", java.util.Collections.nCopies(60,
      "The kettle boils water for tea in the kitchen within three minutes."));

  private static List<TextSegment> household() {
    return List.of(
        TextSegment.from(KETTLE, Metadata.from(Map.of("room", "kitchen", "watts", 2200))),
        TextSegment.from("The toaster browns four slices of bread for breakfast.",
            Metadata.from(Map.of("room", "kitchen", "watts", 900))),
        TextSegment.from("The lawn mower cuts the grass in the garden on Saturdays.",
            Metadata.from(Map.of("room", "garden", "watts", 1200))));
  }

  private List<String> texts(List<Content> contents) {
    return contents.stream().map(c -> c.textSegment().text()).toList();
  }

  @Test
  void theEmbeddingModelGivesTheSidecarsVectors() {
    List<Embedding> vectors = embedder.embedAll(List.of(TextSegment.from("boil water for tea"),
        TextSegment.from("a kettle heats water"), TextSegment.from("granite is an igneous rock"))).content();
    assertEquals(3, vectors.size());
    assertEquals(384, vectors.get(0).dimension());   // bge-small-en-v1.5
    assertTrue(cosine(vectors.get(0), vectors.get(1)) > cosine(vectors.get(0), vectors.get(2)));
    assertEquals(384, embedder.dimension());
  }

  @Test
  void contentRetrieverWithAFilterFindsWholeSegmentsWithTheirMetadata() {
    SidecarEmbeddingStore store = store();
    List<TextSegment> segments = household();
    store.addAll(embedder.embedAll(segments).content(), segments);

    EmbeddingStoreContentRetriever kitchen = EmbeddingStoreContentRetriever.builder().embeddingStore(store)
        .embeddingModel(embedder).maxResults(5).filter(metadataKey("room").isEqualTo("kitchen")).build();
    List<Content> found = kitchen.retrieve(Query.from("boil water for tea"));
    assertEquals(List.of(KETTLE, segments.get(1).text()), texts(found), "the kettle's chunks come back once, whole");
    assertEquals("kitchen", found.get(0).textSegment().metadata().getString("room"));
    assertEquals(2200, found.get(0).textSegment().metadata().getInteger("watts"));

    Filter strong = metadataKey("watts").isGreaterThan(1000).and(metadataKey("room").isNotEqualTo("kitchen"));
    assertEquals(List.of(segments.get(2).text()), texts(EmbeddingStoreContentRetriever.builder().embeddingStore(store)
        .embeddingModel(embedder).maxResults(5).filter(strong).build().retrieve(Query.from("garden"))));
    Filter either = Filter.or(metadataKey("room").isIn("garden", "attic"), Filter.not(
        metadataKey("watts").isGreaterThanOrEqualTo(1000)));
    assertEquals(2, EmbeddingStoreContentRetriever.builder().embeddingStore(store).embeddingModel(embedder)
        .maxResults(5).filter(either).build().retrieve(Query.from("appliance")).size());
  }

  @Test
  void minScoreAndScoresAreLangChain4jRelevances() {
    SidecarEmbeddingStore store = store();
    List<TextSegment> segments = household();
    store.addAll(embedder.embedAll(segments).content(), segments);
    List<EmbeddingMatch<TextSegment>> all = store.search(EmbeddingSearchRequest.builder().query("boil water for tea")
        .queryEmbedding(embedder.embed("boil water for tea").content()).maxResults(3).build()).matches();
    assertEquals(3, all.size());
    assertTrue(all.get(0).score() > all.get(1).score() && all.get(0).score() <= 1.0, all::toString);
    assertNull(all.get(0).embedding());
    double cut = (all.get(0).score() + all.get(1).score()) / 2;
    assertEquals(1, store.search(EmbeddingSearchRequest.builder().query("boil water for tea")
        .queryEmbedding(embedder.embed("x").content()).maxResults(3).minScore(cut).build()).matches().size());
  }

  @Test
  void embeddingsOfAnotherModelAreIgnoredAndTheTextIsEmbedded() {
    SidecarEmbeddingStore store = store();
    // A three-dimensional vector from "another model": the sidecar embeds the segment's text instead.
    String id = store.add(Embedding.from(new float[] {0.1f, 0.2f, 0.3f}), TextSegment.from(
        "The espresso machine pulls a double shot in thirty seconds."));
    List<EmbeddingMatch<TextSegment>> found = store.search(EmbeddingSearchRequest.builder()
        .query("how long does a double shot of espresso take?")
        .queryEmbedding(Embedding.from(new float[] {9f, 9f})).maxResults(1).build()).matches();
    assertEquals(id, found.get(0).embeddingId());

    UnsupportedOperationException noText = assertThrows(UnsupportedOperationException.class,
        () -> store.add(Embedding.from(new float[] {1f})));
    assertTrue(noText.getMessage().contains("TextSegment"), noText.getMessage());
    IllegalArgumentException noQuery = assertThrows(IllegalArgumentException.class, () -> store.search(
        EmbeddingSearchRequest.builder().queryEmbedding(Embedding.from(new float[] {1f})).maxResults(1).build()));
    assertTrue(noQuery.getMessage().contains("query"), noQuery.getMessage());
  }

  @Test
  void containsStringCannotBeTranslated() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> store().search(
        EmbeddingSearchRequest.builder().query("x").queryEmbedding(Embedding.from(new float[] {1f}))
            .filter(metadataKey("room").containsString("kit")).build()));
    assertTrue(e.getMessage().contains("cannot translate") && e.getMessage().contains("ContainsString"),
        e.getMessage());
  }

  @Test
  void removeByIdFilterAndAll() {
    SidecarEmbeddingStore store = store();
    List<TextSegment> segments = household();
    List<String> ids = List.of("kettle", "toaster", "mower");
    store.addAll(ids, null, segments);
    store.remove("toaster");
    assertEquals(List.of("kettle", "mower"), found(store));
    store.removeAll(metadataKey("room").isEqualTo("garden"));
    assertEquals(List.of("kettle"), found(store));
    store.removeAll();
    assertEquals(List.of(), found(store));
  }

  @Test
  void theReadmeStoreExampleRuns(@TempDir Path out) throws ReflectiveOperationException {
    ReadmeExamples.Block block = ReadmeExamples.javaBlocks(ReadmeExamples.readme()).stream()
        .filter(b -> b.body().contains("SidecarEmbeddingStore.builder")).findFirst().orElseThrow();
    ReadmeExamples.Block local = new ReadmeExamples.Block(block.imports(),
        block.body().replace("http://127.0.0.1:8080", sidecar.httpUrl()));
    String unit = ReadmeExamples.unit(README_IMPORTS, local,
        "public final class StoreExample {\n  public static List<Content> run(RagSidecarClient client) {\n"
            + ReadmeExamples.EXAMPLE + "\n    return found;\n  }\n}");
    ClassLoader example = ReadmeExamples.compile(Map.of("readme.StoreExample", unit), out);
    @SuppressWarnings("unchecked")
    List<Content> found = (List<Content>) example.loadClass("readme.StoreExample")
        .getMethod("run", RagSidecarClient.class).invoke(null, client);
    assertEquals(List.of("Bob prefers Saturday delivery."), texts(found));
  }

  private List<String> found(SidecarEmbeddingStore store) {
    return store.search(EmbeddingSearchRequest.builder().query("appliance").queryEmbedding(Embedding.from(
        new float[] {1f})).maxResults(10).build()).matches().stream().map(EmbeddingMatch::embeddingId).sorted()
        .toList();
  }

  private static double cosine(Embedding a, Embedding b) {
    float[] x = a.vector();
    float[] y = b.vector();
    double dot = 0;
    double nx = 0;
    double ny = 0;
    for (int i = 0; i < x.length; i++) {
      dot += x[i] * y[i];
      nx += x[i] * x[i];
      ny += y[i] * y[i];
    }
    return dot / Math.sqrt(nx * ny);
  }
}
