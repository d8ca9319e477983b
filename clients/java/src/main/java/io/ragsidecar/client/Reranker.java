package io.ragsidecar.client;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.OptionalInt;
import java.util.concurrent.CompletableFuture;

/**
 * Query-aware document reranking: the client side of the sidecar's {@code RerankerService}, shaped like the host
 * runtime's {@code Reranker} SPI so that a provider can delegate to it in a few lines.
 *
 * <p>Implementations are thread-safe. {@link #supports(String)} is answered locally and never blocks on the
 * network. {@link #rerank(Request)} returns at most {@link Request#topN()} documents, in descending relevance, each
 * referencing a document of the request (by {@linkplain RankedDocument#index() position}) at most once.
 *
 * @see RagSidecarClient#reranker()
 * @see #noOp()
 */
public interface Reranker {

  /**
   * Whether this reranker serves exactly this (case-sensitive) model identifier. Never a network call; unknown
   * identifiers, {@code null} and the empty string answer {@code false}.
   */
  boolean supports(String model);

  /**
   * Reranks the request's documents against its query.
   *
   * @return the documents in descending relevance, at most {@code topN} of them; possibly empty when a
   *     {@linkplain Request#minRelevanceScore() threshold} rejected every document
   * @throws RagSidecarException when the sidecar rejects or fails the call (see its subclasses)
   */
  List<RankedDocument> rerank(Request request);

  /**
   * Asynchronous {@link #rerank(Request)}: the future completes with the same result, or fails with the same
   * {@link RagSidecarException}. Cancelling the future cancels the call.
   */
  default CompletableFuture<List<RankedDocument>> rerankAsync(Request request) {
    try {
      return CompletableFuture.completedFuture(rerank(request));
    } catch (RuntimeException failure) {
      return CompletableFuture.failedFuture(failure);
    }
  }

  /**
   * The null-object reranker: it supports no model and returns the documents in the order it received them (cut
   * to {@code topN}, unscored: both scores are {@code NaN}). Lets a call site hold a {@code Reranker} whether or
   * not reranking is enabled.
   */
  static Reranker noOp() {
    return NoOpReranker.INSTANCE;
  }

  /**
   * A candidate document.
   *
   * @param id caller's identifier; must be unique within a request when not empty ({@code null} means empty)
   * @param text text scored against the query
   * @param metadata opaque metadata, returned unchanged when {@link Request#returnDocuments()} is set
   */
  record Document(String id, String text, Map<String, String> metadata) {
    public Document {
      id = id == null ? "" : id;
      Objects.requireNonNull(text, "text");
      metadata = metadata == null ? Map.of() : Map.copyOf(metadata);
    }

    /** A document without metadata. */
    public static Document of(String id, String text) {
      return new Document(id, text, Map.of());
    }
  }

  /**
   * One ranked document.
   *
   * @param index position of the document in {@link Request#documents()}
   * @param id the document's id as sent
   * @param relevanceScore relevance in 0..1 ({@code NaN} from the {@linkplain #noOp() no-op reranker})
   * @param rawScore the model's raw output: logit (cross-encoders) or cosine (bi-encoders)
   * @param document the document as the sidecar echoed it when {@link Request#returnDocuments()} was set,
   *     otherwise {@code null}; {@code request.documents().get(index)} is always the one sent
   * @param bestWindow index of the best-scoring window when the document was windowed; 0 otherwise
   */
  record RankedDocument(int index, String id, float relevanceScore, float rawScore, Document document,
      int bestWindow) {
    public RankedDocument {
      Objects.requireNonNull(id, "id");
    }
  }

  /** An immutable rerank request. Build one with {@link #builder()}. */
  final class Request {
    private final String query;
    private final List<Document> documents;
    private final Integer topN;
    private final String model;
    private final boolean returnDocuments;
    private final Integer maxDocumentTokens;
    private final LongDocumentStrategy longDocumentStrategy;
    private final Float minRelevanceScore;
    private final Duration timeout;

    private Request(Builder b) {
      this.query = Objects.requireNonNull(b.query, "query");
      this.documents = List.copyOf(b.documents);
      this.topN = b.topN;
      this.model = b.model;
      this.returnDocuments = b.returnDocuments;
      this.maxDocumentTokens = b.maxDocumentTokens;
      this.longDocumentStrategy = b.longDocumentStrategy;
      this.minRelevanceScore = b.minRelevanceScore;
      this.timeout = b.timeout;
    }

    public static Builder builder() {
      return new Builder();
    }

    /** A request for the default model, every document returned. */
    public static Request of(String query, List<Document> documents) {
      return builder().query(query).documents(documents).build();
    }

    /** The original user query. */
    public String query() {
      return query;
    }

    /** The candidates, in the order the result indices refer to. */
    public List<Document> documents() {
      return documents;
    }

    /** Most results returned; empty returns every (unfiltered) document. */
    public OptionalInt topN() {
      return topN == null ? OptionalInt.empty() : OptionalInt.of(topN);
    }

    /** The model identifier; empty means the sidecar's default reranker. */
    public Optional<String> model() {
      return Optional.ofNullable(model);
    }

    /** Whether each result carries the document as the sidecar echoed it. */
    public boolean returnDocuments() {
      return returnDocuments;
    }

    /** Cap on the tokens of each document; empty uses the model's window. */
    public OptionalInt maxDocumentTokens() {
      return maxDocumentTokens == null ? OptionalInt.empty() : OptionalInt.of(maxDocumentTokens);
    }

    /** What to do with documents longer than the window; empty uses the model's default. */
    public Optional<LongDocumentStrategy> longDocumentStrategy() {
      return Optional.ofNullable(longDocumentStrategy);
    }

    /** Results scoring below this relevance (0..1) are dropped; empty keeps all. */
    public Optional<Float> minRelevanceScore() {
      return Optional.ofNullable(minRelevanceScore);
    }

    /** This call's deadline, measured from the call; empty uses the client's default deadline. */
    public Optional<Duration> timeout() {
      return Optional.ofNullable(timeout);
    }

    /** A builder initialised from this request. */
    public Builder toBuilder() {
      Builder b = new Builder().query(query).documents(documents).model(model).returnDocuments(returnDocuments)
          .longDocumentStrategy(longDocumentStrategy).minRelevanceScore(minRelevanceScore).timeout(timeout);
      b.topN = topN;
      b.maxDocumentTokens = maxDocumentTokens;
      return b;
    }

    @Override
    public String toString() {
      return "Reranker.Request[model=" + model + ", query=" + query + ", documents=" + documents.size()
          + ", topN=" + topN + "]";
    }

    /**
     * Builds a {@link Request}. Only {@code query} is required; the sidecar validates the rest (blank query,
     * no documents, duplicate ids, negative {@code topN}, ...) and answers a {@link ValidationException} naming
     * each offending field.
     */
    public static final class Builder {
      private String query;
      private final List<Document> documents = new ArrayList<>();
      private Integer topN;
      private String model;
      private boolean returnDocuments;
      private Integer maxDocumentTokens;
      private LongDocumentStrategy longDocumentStrategy;
      private Float minRelevanceScore;
      private Duration timeout;

      private Builder() {}

      public Builder query(String query) {
        this.query = Objects.requireNonNull(query, "query");
        return this;
      }

      /** Replaces the documents. */
      public Builder documents(Collection<Document> documents) {
        this.documents.clear();
        documents.forEach(this::document);
        return this;
      }

      /** Appends one document. */
      public Builder document(Document document) {
        this.documents.add(Objects.requireNonNull(document, "document"));
        return this;
      }

      /** Appends one document without metadata. */
      public Builder document(String id, String text) {
        return document(Document.of(id, text));
      }

      /** Most results returned (applied after scoring). */
      public Builder topN(int topN) {
        this.topN = topN;
        return this;
      }

      /** Model identifier; {@code null} or empty means the sidecar's default reranker. */
      public Builder model(String model) {
        this.model = model == null || model.isEmpty() ? null : model;
        return this;
      }

      public Builder returnDocuments(boolean returnDocuments) {
        this.returnDocuments = returnDocuments;
        return this;
      }

      /** Cap on the tokens of each document, at least 1. */
      public Builder maxDocumentTokens(int maxDocumentTokens) {
        if (maxDocumentTokens < 0) {
          throw new IllegalArgumentException("maxDocumentTokens must not be negative: " + maxDocumentTokens);
        }
        this.maxDocumentTokens = maxDocumentTokens;
        return this;
      }

      /** {@code null} uses the model's default. */
      public Builder longDocumentStrategy(LongDocumentStrategy strategy) {
        this.longDocumentStrategy = strategy;
        return this;
      }

      /** Relevance threshold in 0..1; {@code null} keeps every result. */
      public Builder minRelevanceScore(Float minRelevanceScore) {
        this.minRelevanceScore = minRelevanceScore;
        return this;
      }

      /** Deadline of this call; {@code null} uses the client's default deadline. */
      public Builder timeout(Duration timeout) {
        if (timeout != null && (timeout.isNegative() || timeout.isZero())) {
          throw new IllegalArgumentException("timeout must be positive: " + timeout);
        }
        this.timeout = timeout;
        return this;
      }

      public Request build() {
        return new Request(this);
      }
    }
  }
}
