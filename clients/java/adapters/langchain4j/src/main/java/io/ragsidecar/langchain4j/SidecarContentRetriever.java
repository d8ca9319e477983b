package io.ragsidecar.langchain4j;

import dev.langchain4j.data.document.Metadata;
import dev.langchain4j.data.segment.TextSegment;
import dev.langchain4j.rag.content.Content;
import dev.langchain4j.rag.content.ContentMetadata;
import dev.langchain4j.rag.content.retriever.ContentRetriever;
import dev.langchain4j.rag.query.Query;
import io.ragsidecar.client.HitDocument;
import io.ragsidecar.client.KnowledgeChunk;
import io.ragsidecar.client.SidecarRetrieval;
import io.ragsidecar.v1.SearchOptions;
import io.ragsidecar.v1.SearchRequest;
import io.ragsidecar.v1.Target;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * A LangChain4j {@link ContentRetriever} over the sidecar's Search: each query searches the SEARCH knowledge declared
 * by a {@link Target} (files, directories, inline text, MEMORY documents) and every hit becomes a {@link Content}.
 *
 * <p>A hit's text is the segment's text and its metadata the layout of {@link HitDocument}, the same as the Spring AI
 * adapter's: {@code source} (the knowledge name), {@code chunk_id}, and when known {@code document_id}, {@code file}
 * and {@code rerank_score}. A ranked hit's score is the {@link ContentMetadata#SCORE}. The scope (principal, tenant, session) is the one of the {@link SidecarRetrieval}
 * given, e.g. {@code client.retrieval().withScope(scope)}.
 */
public final class SidecarContentRetriever implements ContentRetriever {
  private final SidecarRetrieval retrieval;
  private final SearchRequest template;

  private SidecarContentRetriever(SidecarRetrieval retrieval, SearchRequest template) {
    this.retrieval = retrieval;
    this.template = template;
  }

  public static Builder builder() {
    return new Builder();
  }

  @Override
  public List<Content> retrieve(Query query) {
    SearchRequest request = template.toBuilder().setQuery(query.text()).build();
    return retrieval.search(request).hits().stream().map(SidecarContentRetriever::content).toList();
  }

  private static Content content(KnowledgeChunk hit) {
    HitDocument document = HitDocument.of(hit);
    TextSegment segment = TextSegment.from(document.text(), Metadata.from(document.metadata()));
    return document.score() == null ? Content.from(segment)
        : Content.from(segment, Map.of(ContentMetadata.SCORE, document.score()));
  }

  /** Builds a {@link SidecarContentRetriever}; {@link #retrieval} and {@link #target} are required. */
  public static final class Builder {
    private SidecarRetrieval retrieval;
    private final SearchRequest.Builder template = SearchRequest.newBuilder();

    private Builder() {}

    /** The retrieval facade, with its scope: {@code client.retrieval().withScope(scope)}. */
    public Builder retrieval(SidecarRetrieval retrieval) {
      this.retrieval = retrieval;
      return this;
    }

    /** The knowledge declarations searched (see {@code RetrievalRequests.target}). */
    public Builder target(Target target) {
      template.setTarget(target);
      return this;
    }

    /** Searches only these of the target's knowledge entries (default: all its SEARCH entries). */
    public Builder knowledge(String... names) {
      template.clearKnowledge().addAllKnowledge(List.of(names));
      return this;
    }

    /** Hits to return at most (default: the entries' own top k). */
    public Builder topK(int topK) {
      template.setTopK(topK);
      return this;
    }

    /** Drops hits scoring below this. */
    public Builder minScore(float minScore) {
      template.setMinScore(minScore);
      return this;
    }

    /** Search options for every entry, e.g. {@code RetrievalRequests.rerank(model, order)}. */
    public Builder searchOptions(SearchOptions options) {
      template.setSearch(options);
      return this;
    }

    public SidecarContentRetriever build() {
      Objects.requireNonNull(retrieval, "retrieval");
      if (!template.hasTarget()) {
        throw new IllegalStateException("a target with the knowledge to search is required");
      }
      return new SidecarContentRetriever(retrieval, template.build());
    }
  }
}
