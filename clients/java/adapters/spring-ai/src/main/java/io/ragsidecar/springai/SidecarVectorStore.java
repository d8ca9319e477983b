package io.ragsidecar.springai;

import com.google.protobuf.Timestamp;
import io.ragsidecar.client.KnowledgeScope;
import io.ragsidecar.client.Metadata;
import io.ragsidecar.client.RagSidecarClient;
import io.ragsidecar.client.RetrievalRequests;
import io.ragsidecar.client.SidecarRetrieval;
import io.ragsidecar.client.StoredDocument;
import io.ragsidecar.v1.Filter;
import io.ragsidecar.v1.KnowledgeUse;
import io.ragsidecar.v1.MemoryDocument;
import io.ragsidecar.v1.MetadataValue;
import io.ragsidecar.v1.SearchOptions;
import io.ragsidecar.v1.Target;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import org.springframework.ai.document.Document;
import org.springframework.ai.vectorstore.SearchRequest;
import org.springframework.ai.vectorstore.VectorStore;
import org.springframework.ai.vectorstore.filter.Filter.Expression;

/**
 * A Spring AI {@link VectorStore} whose documents are the sidecar's MEMORY documents of one knowledge name in one
 * (tenant, session): the sidecar chunks and embeds them with its own model, so the host brings no
 * {@code EmbeddingModel}.
 *
 * <ul>
 *   <li>{@link #add}: each document by its id (an existing id is replaced), its text, and its metadata as typed
 *       metadata: strings, numbers, booleans, dates ({@code Date}, {@code Instant}, ...), lists of strings, enums (as
 *       their name); another kind is an {@link IllegalArgumentException} naming the key. A metadata entry
 *       {@link #EXPIRES_AT} (an {@code Instant} or {@code Date}) is the document's expiry, not metadata; without
 *       one, {@link Builder#timeToLive} gives it. Documents without text are refused.
 *   <li>{@link #similaritySearch(SearchRequest)}: the query searched by the sidecar (dense and BM25), {@code topK}
 *       documents (a document split into chunks comes back once), {@code similarityThreshold} compared with the
 *       cosine similarity of the query and the document's best chunk, and {@code filterExpression} translated to
 *       the sidecar's filter ({@code docs/memory.md}, "Framework mappings"; what cannot be translated is an
 *       {@link IllegalArgumentException}). Each {@link Document} has the id, text and metadata the host added, and
 *       as score that cosine similarity. A blank query lists up to {@code topK} documents the filter keeps, by id,
 *       without a score.
 *   <li>{@link #delete(List)} by ids and {@link #delete(Expression)} by filter.
 * </ul>
 *
 * <p>Thread-safe and immutable; it holds no connection of its own (close the client when done).
 */
public final class SidecarVectorStore implements VectorStore {
  /** Metadata key of a document's expiry (an {@code Instant} or {@code Date}); the same name filters see. */
  public static final String EXPIRES_AT = "$expires_at";
  /** Documents per UpsertDocuments call. */
  private static final int WRITE_BATCH = 256;

  private final SidecarRetrieval retrieval;
  private final String knowledge;
  private final Target target;
  private final SearchOptions search;
  private final Duration timeToLive;

  private SidecarVectorStore(Builder b) {
    this.retrieval = b.client.retrieval().withScope(b.scope);
    this.knowledge = b.knowledge;
    this.target = RetrievalRequests.target(b.targetName,
        List.of(RetrievalRequests.memory(b.knowledge, KnowledgeUse.KNOWLEDGE_USE_SEARCH).build()));
    this.search = b.search;
    this.timeToLive = b.timeToLive;
  }

  /** A store over this client; set {@link Builder#knowledge} and {@link Builder#scope}. */
  public static Builder builder(RagSidecarClient client) {
    return new Builder(client);
  }

  @Override
  public void add(List<Document> documents) {
    Objects.requireNonNull(documents, "documents");
    Instant now = Instant.now();
    List<MemoryDocument> batch = new ArrayList<>(Math.min(documents.size(), WRITE_BATCH));
    for (Document document : documents) {
      batch.add(memoryDocument(document, now));
      if (batch.size() == WRITE_BATCH) {
        retrieval.upsertDocuments(knowledge, batch);
        batch.clear();
      }
    }
    if (!batch.isEmpty()) {
      retrieval.upsertDocuments(knowledge, batch);
    }
  }

  @Override
  public void delete(List<String> idList) {
    if (!Objects.requireNonNull(idList, "idList").isEmpty()) {
      retrieval.deleteDocuments(knowledge, idList);
    }
  }

  @Override
  public void delete(Expression filterExpression) {
    retrieval.deleteDocuments(knowledge, SpringAiFilters.translate(Objects.requireNonNull(filterExpression,
        "filterExpression")));
  }

  @Override
  public List<Document> similaritySearch(SearchRequest request) {
    Objects.requireNonNull(request, "request");
    Filter filter = request.hasFilterExpression() ? SpringAiFilters.translate(request.getFilterExpression()) : null;
    if (request.getQuery() == null || request.getQuery().isBlank()) {
      return retrieval.listDocuments(knowledge, filter, request.getTopK(), "").documents().stream()
          .map(d -> document(d, null)).toList();
    }
    io.ragsidecar.v1.SearchRequest.Builder call = io.ragsidecar.v1.SearchRequest.newBuilder().setTarget(target)
        .addKnowledge(knowledge).setQuery(request.getQuery()).setTopK(request.getTopK()).setSearch(search);
    if (request.getSimilarityThreshold() > SearchRequest.SIMILARITY_THRESHOLD_ACCEPT_ALL) {
      call.setMinScore((float) request.getSimilarityThreshold());
    }
    if (filter != null) {
      call.putFilters(knowledge, filter);
    }
    return retrieval.searchDocuments(call.build()).stream()
        .map(found -> document(found.document(), found.similarity())).toList();
  }

  private MemoryDocument memoryDocument(Document document, Instant now) {
    if (document.getText() == null) {
      throw new IllegalArgumentException("document " + document.getId() + " has no text (media is not stored)");
    }
    Map<String, Object> metadata = new LinkedHashMap<>();
    Object expiresAt = null;
    for (Map.Entry<String, Object> e : document.getMetadata().entrySet()) {
      if (e.getKey().equals(EXPIRES_AT)) {
        expiresAt = e.getValue();
      } else if (e.getValue() != null) {
        metadata.put(e.getKey(), e.getValue() instanceof Enum<?> en ? en.name() : e.getValue());
      }
    }
    MemoryDocument.Builder out = MemoryDocument.newBuilder().setId(document.getId()).setText(document.getText())
        .putAllTypedMetadata(Metadata.values(metadata));
    if (expiresAt != null) {
      out.setExpiresAt(expiry(document.getId(), expiresAt));
    } else if (timeToLive != null) {
      out.setExpiresAt(Metadata.timestamp(now.plus(timeToLive)));
    }
    return out.build();
  }

  private static Timestamp expiry(String id, Object value) {
    MetadataValue v = Metadata.value(value);
    if (!v.hasTimestampValue()) {
      throw new IllegalArgumentException("document " + id + ": " + EXPIRES_AT + " must be an Instant or a Date, not "
          + value.getClass().getName());
    }
    return v.getTimestampValue();
  }

  private static Document document(StoredDocument stored, Double score) {
    Map<String, Object> metadata = new LinkedHashMap<>(stored.metadata());
    stored.expiresAt().ifPresent(at -> metadata.put(EXPIRES_AT, at));
    return Document.builder().id(stored.id()).text(stored.text()).metadata(metadata).score(score).build();
  }

  @Override
  public String toString() {
    return "SidecarVectorStore[knowledge=" + knowledge + ", " + retrieval + "]";
  }

  /** Configures a {@link SidecarVectorStore}. */
  public static final class Builder {
    private final RagSidecarClient client;
    private String knowledge;
    private KnowledgeScope scope;
    private String targetName = SidecarVectorStore.class.getName();
    private SearchOptions search = SearchOptions.getDefaultInstance();
    private Duration timeToLive;

    private Builder(RagSidecarClient client) {
      this.client = Objects.requireNonNull(client, "client");
    }

    /** The MEMORY knowledge name the documents are kept under; required. */
    public Builder knowledge(String knowledge) {
      this.knowledge = Objects.requireNonNull(knowledge, "knowledge");
      return this;
    }

    /** The principal and (tenant, session) partition; required. */
    public Builder scope(KnowledgeScope scope) {
      this.scope = Objects.requireNonNull(scope, "scope");
      return this;
    }

    /** The target name the searches are declared under (what the sidecar's logs and metrics show). */
    public Builder targetName(String targetName) {
      this.targetName = Objects.requireNonNull(targetName, "targetName");
      return this;
    }

    /** Search options (retrieval mode, reranking, ...); documents always come back once each. */
    public Builder search(SearchOptions search) {
      this.search = Objects.requireNonNull(search, "search");
      return this;
    }

    /** Expiry of added documents that carry no {@link #EXPIRES_AT} of their own: this long after {@code add}. */
    public Builder timeToLive(Duration timeToLive) {
      if (timeToLive.isNegative() || timeToLive.isZero()) {
        throw new IllegalArgumentException("timeToLive must be positive: " + timeToLive);
      }
      this.timeToLive = timeToLive;
      return this;
    }

    public SidecarVectorStore build() {
      if (knowledge == null || scope == null) {
        throw new IllegalStateException("a SidecarVectorStore needs knowledge(...) and scope(...)");
      }
      return new SidecarVectorStore(this);
    }
  }
}
