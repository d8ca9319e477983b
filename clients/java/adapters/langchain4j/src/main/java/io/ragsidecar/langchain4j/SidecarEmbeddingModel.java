package io.ragsidecar.langchain4j;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.langchain4j.data.embedding.Embedding;
import dev.langchain4j.data.segment.TextSegment;
import dev.langchain4j.model.embedding.EmbeddingModel;
import dev.langchain4j.model.output.Response;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;

/**
 * The sidecar's embedder as a LangChain4j {@link EmbeddingModel}: the sidecar's HTTP API, OpenAI's
 * {@code POST /v1/embeddings} (the gRPC services have no embedding call; the sidecar must run with
 * {@code http.port} set, see docs/http.md). The vectors are the sidecar's, the model's own, as
 * {@link SidecarEmbeddingStore} indexes them; with that store the query embedding is not needed (it searches the
 * query text), so the model is there for LangChain4j's {@code EmbeddingStoreContentRetriever} and for hosts that
 * want the same vectors elsewhere. Thread-safe; one {@link HttpClient}, no threads of its own.
 */
public final class SidecarEmbeddingModel implements EmbeddingModel {
  private static final ObjectMapper JSON = new ObjectMapper();

  private final URI endpoint;
  private final String model;
  private final String bearerToken;
  private final Duration timeout;
  private final HttpClient http;

  private SidecarEmbeddingModel(Builder b) {
    this.endpoint = b.baseUrl.resolve("/v1/embeddings");
    this.model = b.model;
    this.bearerToken = b.bearerToken;
    this.timeout = b.timeout;
    this.http = HttpClient.newBuilder().connectTimeout(b.timeout).build();
  }

  /**
   * A model calling the sidecar's HTTP API at this base URL (for example {@code http://127.0.0.1:8080}) with this
   * configured bi-encoder: the sidecar's {@code [retrieval] embedder} gives the vectors its MEMORY search uses.
   */
  public static Builder builder(URI baseUrl, String model) {
    return new Builder(baseUrl, model);
  }

  @Override
  public Response<List<Embedding>> embedAll(List<TextSegment> segments) {
    ObjectNode body = JSON.createObjectNode().put("model", model);
    segments.forEach(s -> body.withArray("input").add(s.text()));
    HttpRequest.Builder request = HttpRequest.newBuilder(endpoint).timeout(timeout)
        .header("Content-Type", "application/json")
        .POST(HttpRequest.BodyPublishers.ofString(body.toString()));
    if (bearerToken != null) {
      request.header("Authorization", "Bearer " + bearerToken);
    }
    HttpResponse<String> response;
    try {
      response = http.send(request.build(), HttpResponse.BodyHandlers.ofString());
    } catch (IOException e) {
      throw new UncheckedIOException("sidecar embeddings at " + endpoint + ": " + e.getMessage(), e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while embedding at " + endpoint, e);
    }
    if (response.statusCode() != 200) {
      throw new IllegalStateException("sidecar embeddings at " + endpoint + " answered " + response.statusCode()
          + ": " + response.body());
    }
    try {
      JsonNode data = JSON.readTree(response.body()).path("data");
      List<Embedding> out = new ArrayList<>(segments.size());
      for (JsonNode item : data) {
        JsonNode vector = item.path("embedding");
        float[] values = new float[vector.size()];
        for (int i = 0; i < values.length; i++) {
          values[i] = (float) vector.get(i).asDouble();
        }
        out.add(Embedding.from(values));
      }
      if (out.size() != segments.size()) {
        throw new IllegalStateException("sidecar embeddings answered " + out.size() + " vectors for "
            + segments.size() + " texts");
      }
      return Response.from(out);
    } catch (IOException e) {
      throw new UncheckedIOException("sidecar embeddings at " + endpoint + " answered no JSON", e);
    }
  }

  @Override
  public String modelName() {
    return model;
  }

  @Override
  public String toString() {
    return "SidecarEmbeddingModel[" + endpoint + ", model=" + model + "]";
  }

  /** Configures a {@link SidecarEmbeddingModel}. */
  public static final class Builder {
    private final URI baseUrl;
    private final String model;
    private String bearerToken;
    private Duration timeout = Duration.ofSeconds(30);

    private Builder(URI baseUrl, String model) {
      this.baseUrl = Objects.requireNonNull(baseUrl, "baseUrl");
      this.model = Objects.requireNonNull(model, "model");
    }

    /** The sidecar's RAGSIDECAR_TOKEN, when it sets one. */
    public Builder bearerToken(String bearerToken) {
      this.bearerToken = bearerToken;
      return this;
    }

    /** Per request; 30 seconds by default. */
    public Builder timeout(Duration timeout) {
      this.timeout = Objects.requireNonNull(timeout, "timeout");
      return this;
    }

    public SidecarEmbeddingModel build() {
      return new SidecarEmbeddingModel(this);
    }
  }
}
