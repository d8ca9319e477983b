package io.ragsidecar.client;

import static io.ragsidecar.client.HostRerankers.answering;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.ragsidecar.v1.HitScores;
import io.ragsidecar.v1.Provenance;
import io.ragsidecar.v1.RetrievedChunk;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The one hit-to-document layout and the checked ranking both JVM adapters use; pure, no sidecar. */
class HitDocumentTest {

  @Test
  void aRankedHitCarriesEveryKeyAndItsChunkIdAsId() {
    HitDocument document = HitDocument.of(KnowledgeChunk.fromProto(RetrievedChunk.newBuilder().setChunkId("c-1")
        .setSource("products").setText("The Toaster T4.").setScore(0.75f)
        .setProvenance(Provenance.newBuilder().setFile("products.jsonl").setDocumentId("toaster"))
        .setScores(HitScores.newBuilder().setRerank(0.5f)).build()));
    assertEquals("c-1", document.id());
    assertEquals("The Toaster T4.", document.text());
    assertEquals(0.75, document.score(), 1e-6);
    assertEquals(List.of(HitDocument.SOURCE, HitDocument.CHUNK_ID, HitDocument.DOCUMENT_ID, HitDocument.FILE,
        HitDocument.RERANK_SCORE), List.copyOf(document.metadata().keySet()));
    assertEquals(Map.of("source", "products", "chunk_id", "c-1", "document_id", "toaster", "file", "products.jsonl",
        "rerank_score", 0.5), document.metadata());
  }

  @Test
  void anUnrankedHitHasNoScoreAndOnlyTheKeysItKnows() {
    HitDocument document = HitDocument.of(KnowledgeChunk.fromProto(RetrievedChunk.newBuilder().setChunkId("c-2")
        .setSource("policy").setText("Returns within 30 days.").build()));
    assertNull(document.score());
    assertEquals(Map.of("source", "policy", "chunk_id", "c-2"), document.metadata());
    assertThrows(UnsupportedOperationException.class, () -> document.metadata().put("x", "y"));
  }

  @Test
  void scoreAllGivesOneRelevancePerDocumentInOrderAndZeroForTheDropped() {
    Reranker.Request request = Reranker.Request.of("toast", List.of(Reranker.Document.of("", "a"),
        Reranker.Document.of("", "b"), Reranker.Document.of("", "c")));
    assertEquals(List.of(0.0, 0.25, 0.5), CheckedRanking.scoreAll(answering(2, 1), request));
  }

  @Test
  void aResultOutsideTheGivenDocumentsOrRepeatedFailsNamingTheIndex() {
    Reranker.Request request = Reranker.Request.of("toast", List.of(Reranker.Document.of("", "a"),
        Reranker.Document.of("", "b")));
    IllegalStateException outside = assertThrows(IllegalStateException.class,
        () -> CheckedRanking.scoreAll(answering(5), request));
    assertEquals("reranker result references document index 5, but 2 documents were given (0..1)",
        outside.getMessage());
    assertThrows(IllegalStateException.class, () -> CheckedRanking.rerank(answering(-1), request));
    IllegalStateException twice = assertThrows(IllegalStateException.class,
        () -> CheckedRanking.rerank(answering(1, 1), request));
    assertTrue(twice.getMessage().contains("index 1 twice"), twice.getMessage());
  }
}
