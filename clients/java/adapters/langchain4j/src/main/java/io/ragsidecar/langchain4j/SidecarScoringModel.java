package io.ragsidecar.langchain4j;

import dev.langchain4j.data.segment.TextSegment;
import dev.langchain4j.model.output.Response;
import dev.langchain4j.model.scoring.ScoringModel;
import io.ragsidecar.client.CheckedRanking;
import io.ragsidecar.client.Reranker;
import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;

/**
 * A LangChain4j {@link ScoringModel} over the sidecar's reranker; plug it into a
 * {@link dev.langchain4j.rag.content.aggregator.ReRankingContentAggregator}, whose {@code maxResults} is the top N,
 * applied after every candidate has been scored.
 *
 * <p>{@link #scoreAll} returns one relevance (0..1) per segment, in the segments' order
 * ({@link CheckedRanking#scoreAll}, as the Spring AI adapter checks): a reranker whose results reference a document
 * that was not given, or one twice, fails the call with an {@link IllegalStateException} naming the index (the
 * sidecar's client itself throws {@link io.ragsidecar.client.ContractViolationException} first). A model the sidecar does not serve fails the call with
 * {@link io.ragsidecar.client.UnknownModelException}. With {@link Builder#minRelevanceScore} the sidecar drops
 * documents below the threshold; they score 0, and when it drops every one of a non-empty input that is logged (a
 * WARNING on this class's {@link System.Logger}), since a reranker that rejects everything is usually misconfigured.
 */
public final class SidecarScoringModel implements ScoringModel {
  private static final System.Logger LOG = System.getLogger(SidecarScoringModel.class.getName());

  private final Reranker reranker;
  private final String model;
  private final Float minRelevanceScore;
  private final Duration timeout;

  private SidecarScoringModel(Builder b) {
    this.reranker = Objects.requireNonNull(b.reranker, "reranker");
    this.model = b.model;
    this.minRelevanceScore = b.minRelevanceScore;
    this.timeout = b.timeout;
  }

  /** A scoring model over this reranker (usually {@code client.reranker()}) with the sidecar's default model. */
  public static SidecarScoringModel of(Reranker reranker) {
    return builder().reranker(reranker).build();
  }

  public static Builder builder() {
    return new Builder();
  }

  @Override
  public Response<List<Double>> scoreAll(List<TextSegment> segments, String query) {
    if (segments.isEmpty()) {
      return Response.from(List.of());
    }
    List<Double> scores = CheckedRanking.scoreAll(reranker, request(segments, query));
    if (scores.stream().allMatch(score -> score == 0.0)) {
      LOG.log(Level.WARNING, "reranker{0} returned no result for {1} documents (min relevance score {2})",
          model == null ? "" : " " + model, segments.size(), minRelevanceScore);
    }
    return Response.from(scores);
  }

  private Reranker.Request request(List<TextSegment> segments, String query) {
    List<Reranker.Document> documents = new ArrayList<>(segments.size());
    for (TextSegment segment : segments) {
      documents.add(Reranker.Document.of("", segment.text()));
    }
    Reranker.Request.Builder b = Reranker.Request.builder().query(query).documents(documents);
    if (model != null) {
      b.model(model);
    }
    if (minRelevanceScore != null) {
      b.minRelevanceScore(minRelevanceScore);
    }
    if (timeout != null) {
      b.timeout(timeout);
    }
    return b.build();
  }

  /** Builds a {@link SidecarScoringModel}; only {@link #reranker} is required. */
  public static final class Builder {
    private Reranker reranker;
    private String model;
    private Float minRelevanceScore;
    private Duration timeout;

    private Builder() {}

    /** The reranker to call, usually {@code client.reranker()}. */
    public Builder reranker(Reranker reranker) {
      this.reranker = reranker;
      return this;
    }

    /** The sidecar model id (case-sensitive); unset or empty means the sidecar's default reranker. */
    public Builder model(String model) {
      this.model = model == null || model.isEmpty() ? null : model;
      return this;
    }

    /** Lets the sidecar drop documents below this relevance; they score 0. */
    public Builder minRelevanceScore(float minRelevanceScore) {
      this.minRelevanceScore = minRelevanceScore;
      return this;
    }

    /** A deadline for each call instead of the client's default one. */
    public Builder timeout(Duration timeout) {
      this.timeout = timeout;
      return this;
    }

    public SidecarScoringModel build() {
      return new SidecarScoringModel(this);
    }
  }
}
