package io.ragsidecar.langchain4j;

import dev.langchain4j.data.document.Metadata;
import dev.langchain4j.data.embedding.Embedding;
import dev.langchain4j.data.segment.TextSegment;
import dev.langchain4j.store.embedding.EmbeddingMatch;
import dev.langchain4j.store.embedding.EmbeddingSearchRequest;
import dev.langchain4j.store.embedding.EmbeddingSearchResult;
import dev.langchain4j.store.embedding.EmbeddingStore;
import dev.langchain4j.store.embedding.filter.Filter;
import io.ragsidecar.client.Filters;
import io.ragsidecar.client.KnowledgeScope;
import io.ragsidecar.client.RagSidecarClient;
import io.ragsidecar.client.RetrievalRequests;
import io.ragsidecar.client.SidecarRetrieval;
import io.ragsidecar.client.StoredDocument;
import io.ragsidecar.v1.KnowledgeUse;
import io.ragsidecar.v1.MemoryDocument;
import io.ragsidecar.v1.SearchOptions;
import io.ragsidecar.v1.SearchRequest;
import io.ragsidecar.v1.Target;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.UUID;

/**
 * A LangChain4j {@link EmbeddingStore} of {@link TextSegment}s kept as the sidecar's MEMORY documents of one knowledge
 * name in one (tenant, session). <b>The sidecar embeds</b>: a segment is stored by its text, which the sidecar chunks
 * and embeds with its own model, and a search searches the request's {@linkplain EmbeddingSearchRequest#query()
 * query text}. Embeddings given to {@code add} and the request's query embedding are ignored, whatever model made
 * them: a host ingesting with another embedding model gets the sidecar's retrieval, not an error and not a mix of
 * vector spaces. So {@code add(Embedding)} and {@code addAll(List<Embedding>)} (no text) are refused, and so is a
 * search without query text ({@code EmbeddingStoreContentRetriever} always gives it). Pair the store with
 * {@link SidecarEmbeddingModel} so the query is embedded once, by the same model, if at all needed.
 *
 * <ul>
 *   <li>Metadata: LangChain4j's strings, UUIDs (as strings) and numbers, kept typed. Read back, numbers are
 *       {@code Double}, and values LangChain4j's {@link Metadata} cannot hold (booleans, timestamps, string lists
 *       other clients wrote) come back as strings.
 *   <li>{@code search}: {@code maxResults} segments (a segment the sidecar split comes back once, whole),
 *       {@code minScore} and each match's score on LangChain4j's relevance scale, {@code (cosine + 1) / 2}, of the
 *       query and the segment's best chunk; the filter translated as {@code docs/memory.md} ("Framework mappings")
 *       says, {@code ContainsString} refused with an {@link IllegalArgumentException}. Matches carry no embedding.
 *   <li>{@code remove}, {@code removeAll(ids)}, {@code removeAll(Filter)}, {@code removeAll()}.
 * </ul>
 *
 * <p>Thread-safe and immutable.
 */
public final class SidecarEmbeddingStore implements EmbeddingStore<TextSegment> {
  private static final int WRITE_BATCH = 256;

  private final SidecarRetrieval retrieval;
  private final String knowledge;
  private final Target target;
  private final SearchOptions search;
  private final Duration timeToLive;

  private SidecarEmbeddingStore(Builder b) {
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
  public String add(Embedding embedding) {
    throw withoutText();
  }

  @Override
  public void add(String id, Embedding embedding) {
    throw withoutText();
  }

  @Override
  public List<String> addAll(List<Embedding> embeddings) {
    throw withoutText();
  }

  @Override
  public String add(Embedding embedding, TextSegment segment) {
    String id = UUID.randomUUID().toString();
    addAll(List.of(id), null, List.of(segment));
    return id;
  }

  @Override
  public void addAll(List<String> ids, List<Embedding> embeddings, List<TextSegment> segments) {
    if (ids.size() != segments.size() || embeddings != null && embeddings.size() != ids.size()) {
      throw new IllegalArgumentException("ids, embeddings and segments differ in size: " + ids.size() + ", "
          + (embeddings == null ? "none" : embeddings.size()) + ", " + segments.size());
    }
    Instant now = Instant.now();
    List<MemoryDocument> batch = new ArrayList<>();
    for (int i = 0; i < ids.size(); i++) {
      batch.add(document(ids.get(i), segments.get(i), now));
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
  public void remove(String id) {
    removeAll(List.of(id));
  }

  @Override
  public void removeAll(Collection<String> ids) {
    if (!ids.isEmpty()) {
      retrieval.deleteDocuments(knowledge, ids);
    }
  }

  @Override
  public void removeAll(Filter filter) {
    retrieval.deleteDocuments(knowledge, LangChain4jFilters.translate(Objects.requireNonNull(filter, "filter")));
  }

  @Override
  public void removeAll() {
    retrieval.deleteDocuments(knowledge, Filters.everything());
  }

  @Override
  public EmbeddingSearchResult<TextSegment> search(EmbeddingSearchRequest request) {
    if (request.query() == null || request.query().isBlank()) {
      throw new IllegalArgumentException("SidecarEmbeddingStore searches by the query's text, which the sidecar "
          + "embeds; this request has only an embedding (set EmbeddingSearchRequest.query)");
    }
    SearchRequest.Builder call = SearchRequest.newBuilder().setTarget(target).addKnowledge(knowledge)
        .setQuery(request.query()).setTopK(request.maxResults()).setSearch(search);
    if (request.minScore() > 0) {
      call.setMinScore((float) (2 * request.minScore() - 1));   // relevance (cos + 1) / 2 back to the cosine
    }
    if (request.filter() != null) {
      call.putFilters(knowledge, LangChain4jFilters.translate(request.filter()));
    }
    // LangChain4j's relevance, (cos + 1) / 2, of the sidecar's cosine; matches carry no embedding (none is exchanged).
    return new EmbeddingSearchResult<>(retrieval.searchDocuments(call.build()).stream()
        .map(found -> new EmbeddingMatch<>((found.similarity() + 1) / 2, found.document().id(), null,
            TextSegment.from(found.document().text(), metadata(found.document()))))
        .toList());
  }

  private MemoryDocument document(String id, TextSegment segment, Instant now) {
    Objects.requireNonNull(segment, "segment");
    Map<String, Object> metadata = new LinkedHashMap<>();
    segment.metadata().toMap().forEach((k, v) -> metadata.put(k, v instanceof UUID u ? u.toString() : v));
    MemoryDocument.Builder out = MemoryDocument.newBuilder().setId(Objects.requireNonNull(id, "id"))
        .setText(segment.text()).putAllTypedMetadata(io.ragsidecar.client.Metadata.values(metadata));
    if (timeToLive != null) {
      out.setExpiresAt(io.ragsidecar.client.Metadata.timestamp(now.plus(timeToLive)));
    }
    return out.build();
  }

  private static Metadata metadata(StoredDocument d) {
    Map<String, Object> out = new LinkedHashMap<>();
    d.metadata().forEach((k, v) -> out.put(k, v instanceof Number || v instanceof String ? v
        : v instanceof List<?> list ? String.join(",", list.stream().map(String::valueOf).toList()) : v.toString()));
    return Metadata.from(out);
  }

  private static UnsupportedOperationException withoutText() {
    return new UnsupportedOperationException("SidecarEmbeddingStore stores text, which the sidecar embeds itself: add "
        + "a TextSegment with it (add(embedding, segment), addAll(embeddings, segments))");
  }

  @Override
  public String toString() {
    return "SidecarEmbeddingStore[knowledge=" + knowledge + ", " + retrieval + "]";
  }

  /** Configures a {@link SidecarEmbeddingStore}. */
  public static final class Builder {
    private final RagSidecarClient client;
    private String knowledge;
    private KnowledgeScope scope;
    private String targetName = SidecarEmbeddingStore.class.getName();
    private SearchOptions search = SearchOptions.getDefaultInstance();
    private Duration timeToLive;

    private Builder(RagSidecarClient client) {
      this.client = Objects.requireNonNull(client, "client");
    }

    /** The MEMORY knowledge name the segments are kept under; required. */
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

    /** Search options (retrieval mode, reranking, ...); segments always come back once each. */
    public Builder search(SearchOptions search) {
      this.search = Objects.requireNonNull(search, "search");
      return this;
    }

    /** Added segments expire this long after they were added (then no search finds them, and they are purged). */
    public Builder timeToLive(Duration timeToLive) {
      if (timeToLive.isNegative() || timeToLive.isZero()) {
        throw new IllegalArgumentException("timeToLive must be positive: " + timeToLive);
      }
      this.timeToLive = timeToLive;
      return this;
    }

    public SidecarEmbeddingStore build() {
      if (knowledge == null || scope == null) {
        throw new IllegalStateException("a SidecarEmbeddingStore needs knowledge(...) and scope(...)");
      }
      return new SidecarEmbeddingStore(this);
    }
  }
}
