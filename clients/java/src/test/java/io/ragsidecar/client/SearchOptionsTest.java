package io.ragsidecar.client;

import static io.ragsidecar.client.RetrievalRequests.document;
import static io.ragsidecar.client.RetrievalRequests.memory;
import static io.ragsidecar.client.RetrievalRequests.target;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.extension.ExtendWith;
import io.ragsidecar.v1.KnowledgeEntry;
import io.ragsidecar.v1.KnowledgeUse;
import io.ragsidecar.v1.MemoryDocument;
import io.ragsidecar.v1.RetrievalMode;
import io.ragsidecar.v1.SearchOptions;
import io.ragsidecar.v1.SearchRequest;

/**
 * SearchOptions' rerank depth, grouping by document and retrieval mode through the real sidecar, on MEMORY documents
 * written here: long ones (several chunks each) on distinct topics and a short one holding a word no model has seen.
 */
@ExtendWith(SidecarExtension.class)
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class SearchOptionsTest {
  private static final String RARE = "zorblaxite";
  private static final String QUERY = "how does magma reach the crater in an eruption";
  private static final KnowledgeEntry NOTES = memory("long-notes", KnowledgeUse.KNOWLEDGE_USE_SEARCH).build();
  private static final Map<String, List<String>> TOPICS = Map.of(
      "volcanoes", List.of("magma", "eruption", "lava", "crater", "basalt", "caldera"),
      "baking", List.of("dough", "yeast", "oven", "flour", "crust", "sourdough"),
      "sailing", List.of("sail", "mast", "hull", "keel", "harbour", "rudder"));

  private RagSidecarClient client;
  private SidecarRetrieval retrieval;

  @BeforeAll
  void start(@SidecarExtension.Options(ownKnowledge = true) Sidecar sidecar) {
    client = sidecar.clientBuilder().defaultDeadline(Duration.ofSeconds(120)).build();
    retrieval = client.retrieval()
        .withScope(new KnowledgeScope("agent-host", "acme", "search-options-" + UUID.randomUUID()));
    List<MemoryDocument> documents = new ArrayList<>();
    TOPICS.forEach((topic, words) -> documents.add(document(topic, longText(topic, words))));
    documents.add(document("minerals", "A mineral named " + RARE + " was catalogued in a quarry ledger."));
    retrieval.upsertDocuments("long-notes", documents);
  }

  @AfterAll
  void stop() {
    client.close();
  }

  /** About 600 words on one topic: several chunks of one document. */
  private static String longText(String topic, List<String> words) {
    int n = words.size();
    return IntStream.range(0, 50).mapToObj(i -> "The " + words.get(i % n) + " and the " + words.get((i * 5 + 1) % n)
            + " matter in " + topic + ", where each " + words.get((i * 3 + 2) % n) + " meets a "
            + words.get((i + 4) % n) + ".")
        .collect(Collectors.joining(" "));
  }

  private SearchResult search(String query, int topK, SearchOptions.Builder options) {
    return retrieval.search(SearchRequest.newBuilder().setTarget(target("Notes", List.of(NOTES)))
        .setQuery(query).setTopK(topK).setSearch(options).build());
  }

  private static List<String> ids(List<KnowledgeChunk> hits) {
    return hits.stream().map(KnowledgeChunk::chunkId).toList();
  }

  @Test
  void rerankDepthGivesTheRerankedHeadThenTheRestInRetrievalOrder() {
    List<String> retrieved = ids(search(QUERY, 100, SearchOptions.newBuilder()).hits());
    assertTrue(retrieved.size() > 3, retrieved::toString);
    SearchResult reranked = search(QUERY, 100, SearchOptions.newBuilder().setRerank(true).setRerankDepth(3));
    assertEquals(3, reranked.usage().getPairs());
    List<String> order = ids(reranked.hits());
    assertEquals(Set.copyOf(retrieved.subList(0, 3)), Set.copyOf(order.subList(0, 3)));
    assertEquals(retrieved.subList(3, retrieved.size()), order.subList(3, order.size()));
    assertTrue(reranked.hits().subList(0, 3).stream().allMatch(h -> h.rerankScore().isPresent()));
    assertTrue(reranked.hits().subList(3, order.size()).stream().noneMatch(h -> h.rerankScore().isPresent()));
  }

  @Test
  void groupByDocumentGivesEachDocumentsBestChunk() {
    List<KnowledgeChunk> chunks = search(QUERY, 100, SearchOptions.newBuilder()).hits();
    List<String> documents = new ArrayList<>(new LinkedHashSet<>(
        chunks.stream().map(KnowledgeChunk::documentId).toList()));
    List<KnowledgeChunk> grouped = search(QUERY, 3, SearchOptions.newBuilder().setGroupByDocument(true)).hits();
    assertEquals(documents.subList(0, 3), grouped.stream().map(KnowledgeChunk::documentId).toList());
    for (KnowledgeChunk hit : grouped) {
      String best = chunks.stream().filter(h -> h.documentId().equals(hit.documentId())).findFirst().orElseThrow()
          .chunkId();
      assertEquals(best, hit.chunkId());
    }
  }

  @Test
  void retrievalModeLexicalFindsTheRareWordAndDenseHasNoBm25() {
    SearchResult lexical = search(RARE + " ledger", 10,
        SearchOptions.newBuilder().setRetrievalMode(RetrievalMode.RETRIEVAL_MODE_LEXICAL));
    assertEquals(List.of("minerals"), lexical.hits().stream().map(KnowledgeChunk::documentId).toList());
    assertTrue(lexical.hits().get(0).proto().getScores().hasBm25());
    SearchResult dense = search(RARE + " ledger", 10,
        SearchOptions.newBuilder().setRetrievalMode(RetrievalMode.RETRIEVAL_MODE_DENSE));
    assertTrue(dense.hits().size() > 1 && dense.hits().stream().noneMatch(h -> h.proto().getScores().hasBm25()));
    ValidationException unknown = assertThrows(ValidationException.class,
        () -> search(QUERY, 3, SearchOptions.newBuilder().setRetrievalModeValue(42)));
    assertEquals("INVALID_REQUEST", unknown.reason());
  }
}
