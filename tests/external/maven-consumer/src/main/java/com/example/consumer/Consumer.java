package com.example.consumer;

import dev.langchain4j.data.segment.TextSegment;
import dev.langchain4j.rag.content.Content;
import dev.langchain4j.rag.query.Query;
import io.ragsidecar.client.KnowledgeScope;
import io.ragsidecar.client.RagSidecarClient;
import io.ragsidecar.client.Reranker;
import io.ragsidecar.client.RetrievalRequests;
import io.ragsidecar.langchain4j.SidecarContentRetriever;
import io.ragsidecar.langchain4j.SidecarScoringModel;
import io.ragsidecar.springai.SidecarDocumentPostProcessor;
import io.ragsidecar.springai.SidecarDocumentRetriever;
import io.ragsidecar.v1.KnowledgeUse;
import io.ragsidecar.v1.Target;
import java.util.List;
import org.springframework.ai.document.Document;

/** What a host writes: one client, and each adapter built on it. */
public final class Consumer implements AutoCloseable {
  private static final KnowledgeScope SCOPE = new KnowledgeScope("consumer", "example", "s1");

  private final RagSidecarClient client;

  public Consumer(RagSidecarClient client) {
    this.client = client;
  }

  /** The client's reranker: the ids of the documents, most relevant first. */
  public List<String> rerank(String query, List<String> texts) {
    Reranker.Request.Builder request = Reranker.Request.builder().query(query);
    for (int i = 0; i < texts.size(); i++) {
      request.document("d" + i, texts.get(i));
    }
    return client.reranker().rerank(request.build()).stream().map(Reranker.RankedDocument::id).toList();
  }

  /** LangChain4j: one relevance per text, in the texts' order. */
  public List<Double> score(String query, List<String> texts) {
    return SidecarScoringModel.of(client.reranker())
        .scoreAll(texts.stream().map(TextSegment::from).toList(), query).content();
  }

  /** LangChain4j: the texts of the hits of a search over inline knowledge. */
  public List<String> retrieve(String query, String knowledge) {
    SidecarContentRetriever retriever = SidecarContentRetriever.builder().target(faq(knowledge))
        .retrieval(client.retrieval().withScope(SCOPE)).build();
    return retriever.retrieve(Query.from(query)).stream().map(Content::textSegment).map(TextSegment::text).toList();
  }

  /** Spring AI: the texts, most relevant first, cut to the top one. */
  public List<String> springRerankTop(String query, List<String> texts) {
    return SidecarDocumentPostProcessor.builder(client).topN(1).build()
        .process(new org.springframework.ai.rag.Query(query), texts.stream().map(Document::new).toList())
        .stream().map(Document::getText).toList();
  }

  /** Spring AI: the texts of the hits of a search over inline knowledge. */
  public List<String> springRetrieve(String query, String knowledge) {
    return SidecarDocumentRetriever.builder(client.retrieval().withScope(SCOPE), faq(knowledge)).build()
        .retrieve(new org.springframework.ai.rag.Query(query)).stream().map(Document::getText).toList();
  }

  private static Target faq(String knowledge) {
    return RetrievalRequests.target("com.example.Faq",
        List.of(RetrievalRequests.inline("faq", KnowledgeUse.KNOWLEDGE_USE_SEARCH, knowledge).build()));
  }

  @Override
  public void close() {
    client.close();
  }
}
