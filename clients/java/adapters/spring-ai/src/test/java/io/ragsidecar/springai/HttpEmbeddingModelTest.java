package io.ragsidecar.springai;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.ragsidecar.client.Sidecar;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.springframework.ai.embedding.EmbeddingModel;
import org.springframework.ai.openai.OpenAiEmbeddingModel;
import org.springframework.ai.openai.OpenAiEmbeddingOptions;

/**
 * Spring AI's own {@link OpenAiEmbeddingModel}, given only the sidecar's HTTP base URL (the bare one docs/http.md
 * gives, or with {@code /v1}) and a dummy key, embeds with the sidecar's bi-encoder.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class HttpEmbeddingModelTest {
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
  @ValueSource(strings = {"", "/v1"})
  void openAiEmbeddingModelEmbedsWithTheBareBaseOrV1(String suffix) {
    OpenAiEmbeddingOptions options = OpenAiEmbeddingOptions.builder()
        .baseUrl(sidecar.httpUrl() + suffix)
        .apiKey("dummy")
        .model("bge-small-en-v1.5")
        .build();
    EmbeddingModel model = OpenAiEmbeddingModel.builder().options(options).build();
    List<float[]> vectors = model.embed(List.of("Berlin is the capital of Germany.", "Paris is in France."));
    assertEquals(2, vectors.size());
    assertEquals(384, vectors.get(0).length);
    double norm = 0;
    for (float x : vectors.get(0)) {
      norm += x * x;
    }
    assertEquals(1.0, Math.sqrt(norm), 1e-3);
  }
}
