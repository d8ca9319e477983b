package io.ragsidecar.langchain4j;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.langchain4j.data.embedding.Embedding;
import dev.langchain4j.data.segment.TextSegment;
import dev.langchain4j.model.cohere.CohereScoringModel;
import dev.langchain4j.model.embedding.EmbeddingModel;
import dev.langchain4j.model.openai.OpenAiEmbeddingModel;
import dev.langchain4j.model.output.Response;
import dev.langchain4j.model.scoring.ScoringModel;
import io.ragsidecar.client.Sidecar;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * LangChain4j's own Cohere and OpenAI clients, given only the sidecar's HTTP base URL (in each form a user might
 * write it) and a dummy key, as docs/http.md tells: the scoring model ranks, the embedding model embeds.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class HttpClientsTest {
  private static final String QUERY = "What is the capital of France?";
  private static final List<TextSegment> SEGMENTS = List.of(
      TextSegment.from("Berlin is the capital of Germany."),
      TextSegment.from("Paris is the capital and largest city of France."));

  private Sidecar sidecar;

  @BeforeAll
  void start() {
    sidecar = Sidecar.startWithHttp();
  }

  @AfterAll
  void stop() {
    sidecar.close();
  }

  @ParameterizedTest
  @ValueSource(strings = {"", "/v1", "/v1/"})
  void cohereScoringModelRanksWithAnyBaseUrl(String suffix) {
    ScoringModel model = CohereScoringModel.builder()
        .baseUrl(sidecar.httpUrl() + suffix)
        .apiKey("dummy")
        .modelName("ms-marco-MiniLM-L-12-v2")
        .build();
    Response<List<Double>> response = model.scoreAll(SEGMENTS, QUERY);
    List<Double> scores = response.content();
    assertEquals(2, scores.size());
    assertTrue(scores.get(1) > 0.5 && scores.get(0) < 0.5, "scores: " + scores);
  }

  @ParameterizedTest
  @ValueSource(strings = {"", "/v1"})
  void openAiEmbeddingModelEmbedsWithTheBareBaseOrV1(String suffix) {
    EmbeddingModel model = OpenAiEmbeddingModel.builder()
        .baseUrl(sidecar.httpUrl() + suffix)
        .apiKey("dummy")
        .modelName("bge-small-en-v1.5")
        .build();
    List<Embedding> embeddings = model.embedAll(SEGMENTS).content();
    assertEquals(2, embeddings.size());
    assertEquals(384, embeddings.get(0).dimension());
    double norm = 0;
    for (float x : embeddings.get(0).vector()) {
      norm += x * x;
    }
    assertEquals(1.0, Math.sqrt(norm), 1e-3);
  }
}
