package io.ragsidecar.springai;

import io.ragsidecar.client.CheckedRanking;
import io.ragsidecar.client.RagSidecarClient;
import io.ragsidecar.client.Reranker;
import io.ragsidecar.client.Reranker.RankedDocument;
import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import org.springframework.ai.document.Document;
import org.springframework.ai.rag.Query;
import org.springframework.ai.rag.postretrieval.document.DocumentPostProcessor;

/**
 * A Spring AI {@link DocumentPostProcessor} that reranks the retrieved documents against the query with the sidecar's
 * reranker (or any {@link Reranker}) and keeps the best {@code topN}, in descending relevance, each document's
 * {@linkplain Document#getScore() score} replaced by its relevance (0..1).
 *
 * <p>The result only holds documents it was given, each at most once; a reranker that answers otherwise fails the
 * call with an {@link IllegalStateException} naming the index ({@link CheckedRanking}, as the LangChain4j adapter
 * checks). An unknown model fails with the client's
 * {@link io.ragsidecar.client.UnknownModelException}. A reranker that keeps none of a non-empty input (a
 * {@linkplain Builder#minRelevanceScore threshold} rejected them all) is logged as a warning, since the model then
 * answers without context.
 */
public final class SidecarDocumentPostProcessor implements DocumentPostProcessor {
  private static final System.Logger LOG = System.getLogger(SidecarDocumentPostProcessor.class.getName());

  private final Reranker reranker;
  private final String model;
  private final Integer topN;
  private final Float minRelevanceScore;
  private final Duration timeout;

  private SidecarDocumentPostProcessor(Builder b) {
    this.reranker = b.reranker;
    this.model = b.model;
    this.topN = b.topN;
    this.minRelevanceScore = b.minRelevanceScore;
    this.timeout = b.timeout;
  }

  /** A post-processor over this client's reranker. */
  public static Builder builder(RagSidecarClient client) {
    return builder(Objects.requireNonNull(client, "client").reranker());
  }

  /** A post-processor over any {@link Reranker} (the sidecar's, or {@link Reranker#noOp()} when disabled). */
  public static Builder builder(Reranker reranker) {
    return new Builder(reranker);
  }

  @Override
  public List<Document> process(Query query, List<Document> documents) {
    Objects.requireNonNull(query, "query");
    Objects.requireNonNull(documents, "documents");
    if (documents.isEmpty()) {
      return List.of();
    }
    List<RankedDocument> ranked = CheckedRanking.rerank(reranker, request(query, documents));
    if (ranked.isEmpty()) {
      LOG.log(Level.WARNING, "reranker model {0} kept none of {1} documents (min relevance score {2}) for query: {3}",
          model == null ? "(default)" : model, documents.size(), String.valueOf(minRelevanceScore), query.text());
    }
    return reordered(documents, ranked);
  }

  private Reranker.Request request(Query query, List<Document> documents) {
    Reranker.Request.Builder b = Reranker.Request.builder().query(query.text()).model(model)
        .minRelevanceScore(minRelevanceScore).timeout(timeout);
    if (topN != null) {
      b.topN(topN);
    }
    // Results reference documents by position, so the ids are left empty: Spring AI ids need not be unique once
    // several retrievers' results are joined.
    for (Document document : documents) {
      if (document.getText() == null) {
        throw new IllegalArgumentException("document " + document.getId() + " has no text to rerank (media only)");
      }
      b.document("", document.getText());
    }
    return b.build();
  }

  private List<Document> reordered(List<Document> documents, List<RankedDocument> ranked) {
    List<Document> out = new ArrayList<>(ranked.size());
    for (RankedDocument r : ranked) {
      Document document = documents.get(r.index());
      out.add(Float.isNaN(r.relevanceScore()) ? document
          : document.mutate().score((double) r.relevanceScore()).build());
    }
    return topN == null || out.size() <= topN ? out : out.subList(0, topN);
  }

  @Override
  public String toString() {
    return "SidecarDocumentPostProcessor[model=" + model + ", topN=" + topN + ", reranker=" + reranker + "]";
  }

  /** Configures a {@link SidecarDocumentPostProcessor}; every option is optional. */
  public static final class Builder {
    private final Reranker reranker;
    private String model;
    private Integer topN;
    private Float minRelevanceScore;
    private Duration timeout;

    private Builder(Reranker reranker) {
      this.reranker = Objects.requireNonNull(reranker, "reranker");
    }

    /** Reranker model identifier (case-sensitive); {@code null} or empty uses the sidecar's default. */
    public Builder model(String model) {
      this.model = model == null || model.isEmpty() ? null : model;
      return this;
    }

    /** Most documents kept, applied after scoring; at least 1. Unset keeps every document. */
    public Builder topN(int topN) {
      if (topN < 1) {
        throw new IllegalArgumentException("topN must be at least 1: " + topN);
      }
      this.topN = topN;
      return this;
    }

    /** Documents scoring below this relevance (0..1) are dropped; {@code null} keeps all. */
    public Builder minRelevanceScore(Float minRelevanceScore) {
      this.minRelevanceScore = minRelevanceScore;
      return this;
    }

    /** Deadline of each rerank call; {@code null} uses the client's default deadline. */
    public Builder timeout(Duration timeout) {
      this.timeout = timeout;
      return this;
    }

    public SidecarDocumentPostProcessor build() {
      return new SidecarDocumentPostProcessor(this);
    }
  }
}
