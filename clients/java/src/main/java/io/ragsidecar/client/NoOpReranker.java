package io.ragsidecar.client;

import java.util.ArrayList;
import java.util.List;

/** {@link Reranker#noOp()}: supports nothing, keeps the received order. */
final class NoOpReranker implements Reranker {
  static final NoOpReranker INSTANCE = new NoOpReranker();

  private NoOpReranker() {}

  @Override
  public boolean supports(String model) {
    return false;
  }

  @Override
  public List<RankedDocument> rerank(Request request) {
    List<Document> documents = request.documents();
    int limit = Math.min(documents.size(), Math.max(0, request.topN().orElse(documents.size())));
    List<RankedDocument> out = new ArrayList<>(limit);
    for (int i = 0; i < limit; i++) {
      Document d = documents.get(i);
      out.add(new RankedDocument(i, d.id(), Float.NaN, Float.NaN, request.returnDocuments() ? d : null, 0));
    }
    return List.copyOf(out);
  }

  @Override
  public String toString() {
    return "Reranker.noOp()";
  }
}
