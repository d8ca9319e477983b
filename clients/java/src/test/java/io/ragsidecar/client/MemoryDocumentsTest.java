package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.ragsidecar.v1.Filter;
import io.ragsidecar.v1.KnowledgeUse;
import io.ragsidecar.v1.MemoryDocument;
import io.ragsidecar.v1.Target;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * The client's MEMORY calls against the real sidecar: typed metadata and expiry written and read back, filters on
 * Search, get by ids, listing page by page, streaming, delete by filter, and a bad filter's violation. Each test
 * writes in a tenant of its own.
 */
@ExtendWith(SidecarExtension.class)
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class MemoryDocumentsTest {
  private static final AtomicInteger TENANTS = new AtomicInteger();
  private static final Target ASSISTANT = RetrievalRequests.target("com.acme.Assistant",
      List.of(RetrievalRequests.memory("notes", KnowledgeUse.KNOWLEDGE_USE_SEARCH).build()));

  private RagSidecarClient client;

  @BeforeAll
  void start(@SidecarExtension.Options(ownKnowledge = true) Sidecar sidecar) {
    client = sidecar.clientBuilder().defaultDeadline(Duration.ofSeconds(120)).build();
  }

  @AfterAll
  void stop() {
    client.close();
  }

  private SidecarRetrieval notes() {
    return client.retrieval().withScope(new KnowledgeScope("agent-host", "memory-" + TENANTS.incrementAndGet(), "s1"));
  }

  private static MemoryDocument note(String id, String text, Map<String, ?> metadata) {
    return MemoryDocument.newBuilder().setId(id).setText(text).putAllTypedMetadata(Metadata.values(metadata)).build();
  }

  @Test
  void typedMetadataAndTimesComeBackAndFilterTheSearch() {
    SidecarRetrieval notes = notes();
    Instant bought = Instant.parse("2025-03-01T10:00:00.123456789Z");
    Instant before = Instant.now().minusSeconds(1);
    notes.upsertDocuments("notes", List.of(
        note("kettle", "The kettle boils water for tea.", Map.of("room", "kitchen", "watts", 2200, "smart", false,
            "tags", List.of("appliance", "hot"), "bought", bought)),
        note("mower", "The lawn mower cuts the grass.", Map.of("room", "garden", "watts", 1200, "smart", true))));

    SidecarRetrieval.DocumentsFound found = notes.getDocuments("notes", List.of("kettle", "nope", "kettle"));
    assertEquals(List.of("nope"), found.notFound());
    StoredDocument kettle = found.documents().get(0);
    assertEquals(Map.of("room", "kitchen", "watts", 2200.0, "smart", false, "tags", List.of("appliance", "hot"),
        "bought", bought), kettle.metadata());
    assertTrue(!kettle.created().isBefore(before) && !kettle.updated().isBefore(kettle.created()), kettle::toString);
    assertTrue(kettle.expiresAt().isEmpty());

    SearchResult hot = notes.search(ASSISTANT, "household machine", 5, Map.of("notes", Filters.and(
        Filters.eq("tags", "hot"), Filters.gte("watts", 2000), Filters.not(Filters.eq("smart", true)))));
    assertEquals(List.of("kettle"), hot.hits().stream().map(KnowledgeChunk::documentId).distinct().toList());
    assertEquals(2200.0, hot.hits().get(0).metadata().get("watts"));
    assertEquals(List.of("mower"), notes.search(ASSISTANT, "household machine", 5, Map.of("notes",
        Filters.or(Filters.in("room", List.of("garden", "attic")), Filters.lt("bought", Instant.EPOCH))))
        .hits().stream().map(KnowledgeChunk::documentId).distinct().toList());
  }

  @Test
  void listingPagesThroughEveryMatchOnceAndStreamingAgrees() {
    SidecarRetrieval notes = notes();
    List<MemoryDocument> documents = new ArrayList<>();
    for (int i = 0; i < 250; i++) {
      documents.add(note(String.format("d%03d", i), "Note number " + i + ".", Map.of("n", i, "even", i % 2 == 0)));
    }
    notes.upsertDocuments("notes", documents);
    Filter even = Filters.eq("even", true);

    List<String> paged = new ArrayList<>();
    String token = "";
    int pages = 0;
    do {
      SidecarRetrieval.DocumentPage page = notes.listDocuments("notes", even, 40, token);
      page.documents().forEach(d -> paged.add(d.id()));
      token = page.nextPageToken();
      pages++;
    } while (!token.isEmpty());
    List<String> expected = IntStream.range(0, 250).filter(i -> i % 2 == 0).mapToObj(i -> String.format("d%03d", i))
        .toList();
    assertEquals(expected, paged);
    assertEquals(4, pages);
    assertEquals(expected, notes.streamDocuments("notes", even, 7).map(StoredDocument::id).toList());
    assertEquals(250, notes.streamDocuments("notes", null, 1000).count());
  }

  @Test
  void deleteByFilterCountsWhatWentAndExpiredDocumentsAreInvisible() {
    SidecarRetrieval notes = notes();
    notes.upsertDocuments("notes", List.of(
        note("a", "Alpha note.", Map.of("n", 1)), note("b", "Beta note.", Map.of("n", 2)),
        note("c", "Gamma note.", Map.of("n", 3)),
        MemoryDocument.newBuilder().setId("gone").setText("An expired note.")
            .setExpiresAt(Metadata.timestamp(Instant.now().minusSeconds(1))).build()));
    assertEquals(List.of("gone"), notes.getDocuments("notes", List.of("gone")).notFound());
    Set<String> listed = notes.streamDocuments("notes", null, 100).map(StoredDocument::id).collect(Collectors.toSet());
    assertEquals(Set.of("a", "b", "c"), listed);

    assertEquals(2, notes.deleteDocuments("notes", Filters.gte("n", 2)).deleted());
    assertEquals(List.of("a"), notes.streamDocuments("notes", null, 100).map(StoredDocument::id).toList());
    notes.deleteDocuments("notes", Filters.everything());
    assertEquals(0, notes.streamDocuments("notes", null, 100).count());
  }

  @Test
  void aBadFilterNamesItsPartAndBadValuesFailBeforeAnyCall() {
    SidecarRetrieval notes = notes();
    Filter ordered = Filters.and(Filters.eq("room", "kitchen"), Filters.lt("smart", true));   // < on a boolean
    ValidationException bad = assertThrows(ValidationException.class,
        () -> notes.listDocuments("notes", ordered, 10, ""));
    assertTrue(bad.violations().stream().anyMatch(v -> v.field().startsWith("filter.all.filters[1]")),
        bad.violations()::toString);

    IllegalArgumentException nan = assertThrows(IllegalArgumentException.class, () -> Filters.eq("n", Double.NaN));
    assertTrue(nan.getMessage().contains("finite"), nan.getMessage());
    IllegalArgumentException list = assertThrows(IllegalArgumentException.class,
        () -> Metadata.values(Map.of("tags", List.of("a", 1))));
    assertTrue(list.getMessage().contains("tags"), list.getMessage());
  }
}
