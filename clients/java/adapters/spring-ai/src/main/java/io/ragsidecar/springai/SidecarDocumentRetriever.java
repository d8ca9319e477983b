package io.ragsidecar.springai;

import io.ragsidecar.client.HitDocument;
import io.ragsidecar.client.KnowledgeChunk;
import io.ragsidecar.client.RetrievalRequests;
import io.ragsidecar.client.SidecarRetrieval;
import io.ragsidecar.v1.KnowledgeEntry;
import io.ragsidecar.v1.SearchOptions;
import io.ragsidecar.v1.SearchRequest;
import io.ragsidecar.v1.Target;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import org.springframework.ai.document.Document;
import org.springframework.ai.rag.Query;
import org.springframework.ai.rag.retrieval.search.DocumentRetriever;

/**
 * A Spring AI {@link DocumentRetriever} over the sidecar's Search: the query's text searched in the knowledge a
 * target declares (files, folders, inline text, MEMORY documents), in the retrieval's scope. Each hit becomes a
 * {@link Document} in the layout of {@link HitDocument}, the same as the LangChain4j adapter's: its id is the chunk
 * id, its score the hit's score ({@code null} for unranked text) and its metadata carries {@link #SOURCE},
 * {@link #CHUNK_ID}, {@link #FILE} and {@link #DOCUMENT_ID} (when not empty) and {@link #RERANK_SCORE} (when the
 * entry reranks). Hits keep the sidecar's order, best first.
 */
public final class SidecarDocumentRetriever implements DocumentRetriever {
  /** Metadata key: the knowledge entry's name ({@link HitDocument#SOURCE}). */
  public static final String SOURCE = HitDocument.SOURCE;
  /** Metadata key: the chunk id, also the document's id ({@link HitDocument#CHUNK_ID}). */
  public static final String CHUNK_ID = HitDocument.CHUNK_ID;
  /** Metadata key: the source file's path relative to its knowledge root ({@link HitDocument#FILE}). */
  public static final String FILE = HitDocument.FILE;
  /** Metadata key: the MEMORY document's id, or a .jsonl/.csv record's key ({@link HitDocument#DOCUMENT_ID}). */
  public static final String DOCUMENT_ID = HitDocument.DOCUMENT_ID;
  /** Metadata key: the reranker's relevance (0..1) when the entry reranks ({@link HitDocument#RERANK_SCORE}). */
  public static final String RERANK_SCORE = HitDocument.RERANK_SCORE;

  private final SidecarRetrieval retrieval;
  private final SearchRequest template;

  private SidecarDocumentRetriever(SidecarRetrieval retrieval, SearchRequest template) {
    this.retrieval = retrieval;
    this.template = template;
  }

  /**
   * A retriever searching this target's knowledge. Give {@code retrieval} its scope first
   * ({@link SidecarRetrieval#withScope}): the sidecar requires one.
   */
  public static Builder builder(SidecarRetrieval retrieval, Target target) {
    return new Builder(retrieval, target);
  }

  /** A retriever searching these knowledge declarations, under a target of this name without actions. */
  public static Builder builder(SidecarRetrieval retrieval, String targetName, List<KnowledgeEntry> knowledge) {
    return builder(retrieval, RetrievalRequests.target(targetName, knowledge));
  }

  @Override
  public List<Document> retrieve(Query query) {
    Objects.requireNonNull(query, "query");
    return retrieval.search(template.toBuilder().setQuery(query.text()).build()).hits().stream()
        .map(SidecarDocumentRetriever::document).toList();
  }

  private static Document document(KnowledgeChunk hit) {
    HitDocument document = HitDocument.of(hit);
    return Document.builder().id(document.id()).text(document.text()).metadata(document.metadata())
        .score(document.score()).build();
  }

  @Override
  public String toString() {
    return "SidecarDocumentRetriever[target=" + template.getTarget().getName() + ", knowledge="
        + template.getKnowledgeList() + "]";
  }

  /** Configures a {@link SidecarDocumentRetriever}; every option replaces the entries' own for each search. */
  public static final class Builder {
    private final SidecarRetrieval retrieval;
    private final SearchRequest.Builder template;

    private Builder(SidecarRetrieval retrieval, Target target) {
      this.retrieval = Objects.requireNonNull(retrieval, "retrieval");
      this.template = SearchRequest.newBuilder().setTarget(Objects.requireNonNull(target, "target"));
    }

    /** Names of the entries to search, whatever their use; none means every enabled SEARCH entry. */
    public Builder knowledge(String... names) {
      template.clearKnowledge().addAllKnowledge(List.of(names));
      return this;
    }

    /** Knowledge in reach beyond the target's own (replaces a target entry of the same name). */
    public Builder outer(List<KnowledgeEntry> entries) {
      template.clearOuter().addAllOuter(entries);
      return this;
    }

    /** Most hits per source; at least 1. */
    public Builder topK(int topK) {
      if (topK < 1) {
        throw new IllegalArgumentException("topK must be at least 1: " + topK);
      }
      template.setTopK(topK);
      return this;
    }

    /** Threshold replacing each entry's {@code min_score}. */
    public Builder minScore(float minScore) {
      template.setMinScore(minScore);
      return this;
    }

    /** Search options (hybrid weights, reranking, ...) replacing each entry's. */
    public Builder search(SearchOptions options) {
      template.setSearch(Objects.requireNonNull(options, "options"));
      return this;
    }

    /** Where FILE and DIRECTORY entries declared without a path lie, by entry name. */
    public Builder resolvedPaths(Map<String, String> paths) {
      template.clearResolvedPaths().putAllResolvedPaths(paths);
      return this;
    }

    public SidecarDocumentRetriever build() {
      return new SidecarDocumentRetriever(retrieval, template.build());
    }
  }
}
