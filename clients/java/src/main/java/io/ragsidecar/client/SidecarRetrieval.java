package io.ragsidecar.client;

import io.grpc.MethodDescriptor;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Objects;
import java.util.Optional;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.concurrent.CompletableFuture;
import java.util.function.Function;
import java.util.function.Supplier;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;
import io.ragsidecar.v1.Filter;
import io.ragsidecar.v1.GetDocumentsRequest;
import io.ragsidecar.v1.GetDocumentsResponse;
import io.ragsidecar.v1.ListDocumentsRequest;
import io.ragsidecar.v1.ListDocumentsResponse;
import io.ragsidecar.v1.DeleteDocumentsRequest;
import io.ragsidecar.v1.DeleteDocumentsResponse;
import io.ragsidecar.v1.EnforceRequest;
import io.ragsidecar.v1.Llm;
import io.ragsidecar.v1.MemoryDocument;
import io.ragsidecar.v1.PrepareChatKnowledgeRequest;
import io.ragsidecar.v1.RequireLoadedRequest;
import io.ragsidecar.v1.RequireReadyRequest;
import io.ragsidecar.v1.SearchOptions;
import io.ragsidecar.v1.SearchRequest;
import io.ragsidecar.v1.SourceCount;
import io.ragsidecar.v1.UpsertDocumentsRequest;
import io.ragsidecar.v1.UpsertDocumentsResponse;
import io.ragsidecar.v1.ValidateConfigurationRequest;
import io.ragsidecar.v1.RetrievalServiceGrpc;
import io.ragsidecar.v1.Target;

/**
 * The sidecar's {@code RetrievalService}: knowledge-context injection at action-dispatch time, the server side of the
 * host's {@code RetrievalSpi}, plus {@link #search} and the write side of MEMORY knowledge. Obtained from
 * {@link RagSidecarClient#retrieval()}.
 *
 * <p>The common calls take a target and plain values ({@link RetrievalRequests} builds targets, entries and models);
 * each has an overload taking the generated request in {@code io.ragsidecar.v1}, for every field the plain ones leave
 * out. Calls are stateless: each request carries the target's declarations it needs. Every request needs a principal
 * and a scope; {@link #withScope(KnowledgeScope)} returns a facade that sets both on every call, replacing whatever
 * the request carried:
 *
 * <pre>{@code
 * SidecarRetrieval retrieval = client.retrieval().withScope(new KnowledgeScope("agent-host", "acme", sessionId));
 * RetrievedContext context = retrieval.enforce(role, "answer", params, RetrievalRequests.llm("gpt-4o"));
 * }</pre>
 *
 * <p>Immutable and thread-safe: {@code withScope} and {@code withTimeout} return new facades on the same channel,
 * cheap enough to create per call. Every method has an {@code ...Async} variant whose future fails with the same
 * {@link RagSidecarException} the blocking one throws; cancelling the future cancels the call.
 *
 * <p>Errors: {@link PermissionDeniedException} (no principal, or a path outside the knowledge roots:
 * {@linkplain PermissionDeniedException#isPathOutsideRoots() PATH_OUTSIDE_ROOTS}), {@link ValidationException}
 * (malformed request, {@code INVALID_CONFIGURATION} with one violation per problem, {@code UNKNOWN_KNOWLEDGE}),
 * {@link KnowledgeNotReadyException} (with the failing {@linkplain FailedPreconditionException#sources() sources}),
 * {@link FailedPreconditionException} ({@code DIRECT_BUDGET_EXCEEDED}, {@code UNKNOWN_MODEL_WINDOW},
 * {@code SOURCE_UNREADABLE}), {@link UnknownModelException} (reranker model), {@link ModelNotReadyException}.
 */
public final class SidecarRetrieval {
  private final ClientContext context;
  private final KnowledgeScope scope;
  private final Duration timeout;

  SidecarRetrieval(ClientContext context) {
    this(context, null, null);
  }

  private SidecarRetrieval(ClientContext context, KnowledgeScope scope, Duration timeout) {
    this.context = context;
    this.scope = scope;
    this.timeout = timeout;
  }

  /** A facade that sets this principal and scope on every request, replacing the request's own. */
  public SidecarRetrieval withScope(KnowledgeScope scope) {
    return new SidecarRetrieval(context, Objects.requireNonNull(scope, "scope"), timeout);
  }

  /** A facade whose calls use this deadline instead of the client's default one. */
  public SidecarRetrieval withTimeout(Duration timeout) {
    if (timeout.isNegative() || timeout.isZero()) {
      throw new IllegalArgumentException("timeout must be positive: " + timeout);
    }
    return new SidecarRetrieval(context, scope, timeout);
  }

  /** The scope this facade applies to every call; empty when requests carry their own. */
  public Optional<KnowledgeScope> scope() {
    return Optional.ofNullable(scope);
  }

  // ---- ValidateConfiguration ------------------------------------------------------------------------------------

  /**
   * Validates a target's knowledge declarations. Configuration problems are not thrown: they are all returned at
   * once, with {@code valid = false}. Throws only when the request itself cannot be evaluated.
   */
  public ConfigurationValidation validateConfiguration(ValidateConfigurationRequest request) {
    return ConfigurationValidation.fromProto(
        context.call(RetrievalServiceGrpc.getValidateConfigurationMethod(), scoped(request), timeout));
  }

  /** Asynchronous {@link #validateConfiguration(ValidateConfigurationRequest)}. */
  public CompletableFuture<ConfigurationValidation> validateConfigurationAsync(ValidateConfigurationRequest request) {
    return async(RetrievalServiceGrpc.getValidateConfigurationMethod(), () -> scoped(request),
        ConfigurationValidation::fromProto);
  }

  /**
   * Checks the target's declarations only ({@code declarations_only}), as the host's one-argument
   * {@code validateConfiguration} does: no source is read or measured, and no model is needed.
   */
  public ConfigurationValidation validateConfiguration(Target target) {
    return validateConfiguration(declarationsCheck(target));
  }

  /** Asynchronous {@link #validateConfiguration(Target)}. */
  public CompletableFuture<ConfigurationValidation> validateConfigurationAsync(Target target) {
    return validateConfigurationAsync(declarationsCheck(target));
  }

  /**
   * Checks the target's declarations and reads and measures its enabled DIRECT sources against their budgets, sized
   * by this model's input window, as at agent init.
   */
  public ConfigurationValidation validateConfiguration(Target target, Llm llm) {
    return validateConfiguration(budgetCheck(target, llm));
  }

  /** Asynchronous {@link #validateConfiguration(Target, Llm)}. */
  public CompletableFuture<ConfigurationValidation> validateConfigurationAsync(Target target, Llm llm) {
    return validateConfigurationAsync(budgetCheck(target, llm));
  }

  // ---- Enforce --------------------------------------------------------------------------------------------------

  /**
   * Resolves the knowledge the action names and gives (DIRECT), searches (SEARCH, with the action's query) or steps
   * through (SEQUENTIAL) it. Benign cases (no knowledge named, an unconfigured WHEN_CONFIGURED source, no query, no
   * hit) return an {@linkplain RetrievedContext#isEmpty() empty} context, never an error.
   */
  public RetrievedContext enforce(EnforceRequest request) {
    return RetrievedContext.fromProto(context.call(RetrievalServiceGrpc.getEnforceMethod(), scoped(request), timeout));
  }

  /** Asynchronous {@link #enforce(EnforceRequest)}. */
  public CompletableFuture<RetrievedContext> enforceAsync(EnforceRequest request) {
    return async(RetrievalServiceGrpc.getEnforceMethod(), () -> scoped(request), RetrievedContext::fromProto);
  }

  /**
   * {@link #enforce(EnforceRequest)} of this target's action with these parameters, converted by
   * {@link RetrievalRequests#params(Map)} in the map's iteration order (use a {@link LinkedHashMap}: the first string
   * value is the default query), on this model ({@code null}: none, so a DIRECT entry without {@code max_tokens}
   * fails with {@code UNKNOWN_MODEL_WINDOW}).
   */
  public RetrievedContext enforce(Target target, String action, Map<String, ?> params, Llm llm) {
    return enforce(enforceRequest(target, action, params, llm));
  }

  /** Asynchronous {@link #enforce(Target, String, Map, Llm)}. */
  public CompletableFuture<RetrievedContext> enforceAsync(Target target, String action, Map<String, ?> params,
      Llm llm) {
    return enforceAsync(enforceRequest(target, action, params, llm));
  }

  // ---- RequireLoaded / RequireReady -----------------------------------------------------------------------------

  /**
   * Loads the named SEARCH sources as the matching {@link #enforce} would, and returns each one's document count in
   * the sidecar's sorted name order (the map iterates in that order).
   */
  public LinkedHashMap<String, Integer> requireLoaded(RequireLoadedRequest request) {
    return counts(context.call(RetrievalServiceGrpc.getRequireLoadedMethod(), scoped(request), timeout)
        .getCountsList());
  }

  /** Asynchronous {@link #requireLoaded(RequireLoadedRequest)}. */
  public CompletableFuture<LinkedHashMap<String, Integer>> requireLoadedAsync(RequireLoadedRequest request) {
    return async(RetrievalServiceGrpc.getRequireLoadedMethod(), () -> scoped(request),
        response -> counts(response.getCountsList()));
  }

  /** {@link #requireLoaded(RequireLoadedRequest)} of these SEARCH sources of the target (at least one name). */
  public LinkedHashMap<String, Integer> requireLoaded(Target target, String... names) {
    return requireLoaded(loadRequest(target, names));
  }

  /** Asynchronous {@link #requireLoaded(Target, String...)}. */
  public CompletableFuture<LinkedHashMap<String, Integer>> requireLoadedAsync(Target target, String... names) {
    return requireLoadedAsync(loadRequest(target, names));
  }

  /**
   * Checks that every configured WHEN_CONFIGURED source in reach holds at least one unit, and returns each checked
   * source's unit count in sorted name order; empty when nothing was checked.
   *
   * @throws KnowledgeNotReadyException naming every {@linkplain FailedPreconditionException#sources() failing
   *     source} when one is missing, empty or unreadable
   */
  public LinkedHashMap<String, Integer> requireReady(RequireReadyRequest request) {
    return counts(context.call(RetrievalServiceGrpc.getRequireReadyMethod(), scoped(request), timeout)
        .getCountsList());
  }

  /** Asynchronous {@link #requireReady(RequireReadyRequest)}. */
  public CompletableFuture<LinkedHashMap<String, Integer>> requireReadyAsync(RequireReadyRequest request) {
    return async(RetrievalServiceGrpc.getRequireReadyMethod(), () -> scoped(request),
        response -> counts(response.getCountsList()));
  }

  /**
   * {@link #requireReady(RequireReadyRequest)} of this target's sources, FILE and DIRECTORY ones located by these
   * per-call paths by knowledge name (empty: the declared paths).
   */
  public LinkedHashMap<String, Integer> requireReady(Target target, Map<String, String> resolvedPaths) {
    return requireReady(readyRequest(target, resolvedPaths));
  }

  /** Asynchronous {@link #requireReady(Target, Map)}. */
  public CompletableFuture<LinkedHashMap<String, Integer>> requireReadyAsync(Target target,
      Map<String, String> resolvedPaths) {
    return requireReadyAsync(readyRequest(target, resolvedPaths));
  }

  // ---- PrepareChatKnowledge -------------------------------------------------------------------------------------

  /**
   * Measures every enabled DIRECT entry of an agent's chat knowledge against its budget, once at agent init, and
   * returns the blocks each chat turn gives.
   */
  public PreparedChatKnowledge prepareChatKnowledge(PrepareChatKnowledgeRequest request) {
    return PreparedChatKnowledge.fromProto(
        context.call(RetrievalServiceGrpc.getPrepareChatKnowledgeMethod(), scoped(request), timeout));
  }

  /** Asynchronous {@link #prepareChatKnowledge(PrepareChatKnowledgeRequest)}. */
  public CompletableFuture<PreparedChatKnowledge> prepareChatKnowledgeAsync(PrepareChatKnowledgeRequest request) {
    return async(RetrievalServiceGrpc.getPrepareChatKnowledgeMethod(), () -> scoped(request),
        PreparedChatKnowledge::fromProto);
  }

  // ---- Search ---------------------------------------------------------------------------------------------------

  /**
   * Searches declared knowledge with a query (which must not be blank), outside any action dispatch. A hit's
   * {@code score} is what hits are ranked by: the fused retrieval score, or for an entry that reranks, by default the
   * reranker's relevance combined with the retrieval order; the rerank relevance only with
   * {@link RetrievalRequests#rerank RERANK_ORDER_RERANKER}. The relevance itself is always
   * {@link KnowledgeChunk#rerankScore()}.
   */
  public SearchResult search(SearchRequest request) {
    return SearchResult.fromProto(context.call(RetrievalServiceGrpc.getSearchMethod(), scoped(request), timeout));
  }

  /** Asynchronous {@link #search(SearchRequest)}. */
  public CompletableFuture<SearchResult> searchAsync(SearchRequest request) {
    return async(RetrievalServiceGrpc.getSearchMethod(), () -> scoped(request), SearchResult::fromProto);
  }

  /**
   * {@link #search(SearchRequest)} of every enabled SEARCH entry in the target's reach, at most top k hits per source
   * (at least 1; checked here, since the request's field is unsigned).
   */
  public SearchResult search(Target target, String query, int topK) {
    return search(searchRequest(target, query, topK).build());
  }

  /** Asynchronous {@link #search(Target, String, int)}. */
  public CompletableFuture<SearchResult> searchAsync(Target target, String query, int topK) {
    return searchAsync(searchRequest(target, query, topK).build());
  }

  /**
   * {@link #search(Target, String, int)} with these search options replacing each entry's own (for example
   * {@link RetrievalRequests#rerank}).
   */
  public SearchResult search(Target target, String query, int topK, SearchOptions options) {
    return search(searchRequest(target, query, topK, options));
  }

  /** Asynchronous {@link #search(Target, String, int, SearchOptions)}. */
  public CompletableFuture<SearchResult> searchAsync(Target target, String query, int topK, SearchOptions options) {
    return searchAsync(searchRequest(target, query, topK, options));
  }

  /**
   * {@link #search(Target, String, int)} keeping only the chunks whose document a filter keeps, by knowledge name
   * (each name must be among the searched entries; see {@link Filters}).
   */
  public SearchResult search(Target target, String query, int topK, Map<String, Filter> filters) {
    return search(searchRequest(target, query, topK).putAllFilters(Objects.requireNonNull(filters, "filters"))
        .build());
  }

  /**
   * The MEMORY documents a search ranks, each once and whole: {@link #search(SearchRequest)} of the one knowledge
   * the request names (its hits grouped by document), then {@link #getDocuments} of their ids, so each comes with its
   * text, metadata and times as stored. A document deleted or expired between the two calls is left out. Each one's
   * {@link ScoredDocument#similarity() similarity} is the cosine of the query and its best chunk, which the request's
   * {@code min_score} compares with when the entry does not rerank.
   *
   * @throws IllegalArgumentException when the request does not name exactly one knowledge
   */
  public List<ScoredDocument> searchDocuments(SearchRequest request) {
    if (request.getKnowledgeCount() != 1) {
      throw new IllegalArgumentException("searchDocuments searches one MEMORY knowledge; the request names "
          + request.getKnowledgeList());
    }
    SearchRequest grouped = request.toBuilder()
        .setSearch(request.getSearch().toBuilder().setGroupByDocument(true)).build();
    Map<String, Double> similarity = new LinkedHashMap<>();
    for (KnowledgeChunk hit : search(grouped).hits()) {
      similarity.putIfAbsent(hit.documentId(), (double) hit.proto().getScores().getDense());
    }
    if (similarity.isEmpty()) {
      return List.of();
    }
    Map<String, StoredDocument> stored = new HashMap<>();
    getDocuments(request.getKnowledge(0), similarity.keySet()).documents().forEach(d -> stored.put(d.id(), d));
    List<ScoredDocument> out = new ArrayList<>(similarity.size());
    similarity.forEach((id, score) -> {
      StoredDocument d = stored.get(id);
      if (d != null) {
        out.add(new ScoredDocument(d, score));
      }
    });
    return out;
  }

  /**
   * A document {@link #searchDocuments} found.
   *
   * @param document the document as stored
   * @param similarity the cosine similarity (-1..1) of the query and the document's best chunk
   */
  public record ScoredDocument(StoredDocument document, double similarity) {}

  // ---- MEMORY writes --------------------------------------------------------------------------------------------

  /**
   * Adds or replaces MEMORY documents, by id, in the request's (tenant, session); they are searchable when the call
   * returns.
   */
  public UpsertResult upsertDocuments(UpsertDocumentsRequest request) {
    return UpsertResult.fromProto(
        context.call(RetrievalServiceGrpc.getUpsertDocumentsMethod(), scoped(request), timeout));
  }

  /** {@link #upsertDocuments(UpsertDocumentsRequest)} of these documents, in this facade's scope. */
  public UpsertResult upsertDocuments(String knowledge, Collection<MemoryDocument> documents) {
    return upsertDocuments(UpsertDocumentsRequest.newBuilder().setKnowledge(knowledge).addAllDocuments(documents)
        .build());
  }

  /** Asynchronous {@link #upsertDocuments(UpsertDocumentsRequest)}. */
  public CompletableFuture<UpsertResult> upsertDocumentsAsync(UpsertDocumentsRequest request) {
    return async(RetrievalServiceGrpc.getUpsertDocumentsMethod(), () -> scoped(request), UpsertResult::fromProto);
  }

  /** Deletes MEMORY documents by id in the request's (tenant, session); absent ids are counted, not an error. */
  public DeleteResult deleteDocuments(DeleteDocumentsRequest request) {
    return DeleteResult.fromProto(
        context.call(RetrievalServiceGrpc.getDeleteDocumentsMethod(), scoped(request), timeout));
  }

  /** {@link #deleteDocuments(DeleteDocumentsRequest)} of these ids, in this facade's scope. */
  public DeleteResult deleteDocuments(String knowledge, Collection<String> ids) {
    return deleteDocuments(DeleteDocumentsRequest.newBuilder().setKnowledge(knowledge).addAllIds(ids).build());
  }

  /** Asynchronous {@link #deleteDocuments(DeleteDocumentsRequest)}. */
  public CompletableFuture<DeleteResult> deleteDocumentsAsync(DeleteDocumentsRequest request) {
    return async(RetrievalServiceGrpc.getDeleteDocumentsMethod(), () -> scoped(request), DeleteResult::fromProto);
  }

  /**
   * Deletes every MEMORY document the filter keeps (expired ones included) in this facade's scope;
   * {@link Filters#everything()} deletes them all. A bad filter is a {@link ValidationException} naming the part.
   */
  public DeleteResult deleteDocuments(String knowledge, Filter filter) {
    return deleteDocuments(DeleteDocumentsRequest.newBuilder().setKnowledge(knowledge)
        .setFilter(Objects.requireNonNull(filter, "filter")).build());
  }

  // ---- MEMORY reads ---------------------------------------------------------------------------------------------

  /** Reads MEMORY documents by id; absent and expired ones are in {@link DocumentsFound#notFound()}. */
  public DocumentsFound getDocuments(GetDocumentsRequest request) {
    return DocumentsFound.fromProto(context.call(RetrievalServiceGrpc.getGetDocumentsMethod(), scoped(request),
        timeout));
  }

  /** {@link #getDocuments(GetDocumentsRequest)} of these ids (1 to 1,000), in this facade's scope. */
  public DocumentsFound getDocuments(String knowledge, Collection<String> ids) {
    return getDocuments(GetDocumentsRequest.newBuilder().setKnowledge(knowledge).addAllIds(ids).build());
  }

  /** Asynchronous {@link #getDocuments(GetDocumentsRequest)}. */
  public CompletableFuture<DocumentsFound> getDocumentsAsync(GetDocumentsRequest request) {
    return async(RetrievalServiceGrpc.getGetDocumentsMethod(), () -> scoped(request), DocumentsFound::fromProto);
  }

  /**
   * One page of the MEMORY documents a filter keeps, in the byte order of their UTF-8 ids; pass
   * {@link DocumentPage#nextPageToken()} with the same knowledge and filter for the next one.
   */
  public DocumentPage listDocuments(ListDocumentsRequest request) {
    return DocumentPage.fromProto(context.call(RetrievalServiceGrpc.getListDocumentsMethod(), scoped(request),
        timeout));
  }

  /**
   * {@link #listDocuments(ListDocumentsRequest)} in this facade's scope: {@code filter} {@code null} lists every
   * document, {@code pageSize} 0 means 100 (at most 1,000), {@code pageToken} empty or {@code null} is the first page.
   */
  public DocumentPage listDocuments(String knowledge, Filter filter, int pageSize, String pageToken) {
    return listDocuments(listRequest(knowledge, filter, pageSize, pageToken));
  }

  /** Asynchronous {@link #listDocuments(ListDocumentsRequest)}. */
  public CompletableFuture<DocumentPage> listDocumentsAsync(ListDocumentsRequest request) {
    return async(RetrievalServiceGrpc.getListDocumentsMethod(), () -> scoped(request), DocumentPage::fromProto);
  }

  /**
   * Every MEMORY document the filter keeps ({@code null}: all), fetched a page of {@code pageSize} at a time as the
   * stream is consumed (each page one ListDocuments call, so a document present throughout comes exactly once).
   */
  public Stream<StoredDocument> streamDocuments(String knowledge, Filter filter, int pageSize) {
    Iterator<StoredDocument> pages = new Iterator<>() {
      private Iterator<StoredDocument> page = Collections.emptyIterator();
      private String token = "";
      private boolean last;

      @Override
      public boolean hasNext() {
        while (!page.hasNext() && !last) {
          DocumentPage next = listDocuments(knowledge, filter, pageSize, token);
          page = next.documents().iterator();
          token = next.nextPageToken();
          last = token.isEmpty();
        }
        return page.hasNext();
      }

      @Override
      public StoredDocument next() {
        if (!hasNext()) {
          throw new NoSuchElementException();
        }
        return page.next();
      }
    };
    return StreamSupport.stream(Spliterators.spliteratorUnknownSize(pages, Spliterator.ORDERED | Spliterator.NONNULL),
        false);
  }

  /**
   * What {@link #getDocuments} found.
   *
   * @param documents the documents found, in the order their ids were first asked for
   * @param notFound ids asked for that are absent or expired, in the order asked
   */
  public record DocumentsFound(List<StoredDocument> documents, List<String> notFound) {
    static DocumentsFound fromProto(GetDocumentsResponse r) {
      return new DocumentsFound(r.getDocumentsList().stream().map(StoredDocument::fromProto).toList(),
          List.copyOf(r.getNotFoundList()));
    }
  }

  /**
   * A page of {@link #listDocuments}.
   *
   * @param documents the page's documents, by id
   * @param nextPageToken the next page's token; empty when this page is the last
   */
  public record DocumentPage(List<StoredDocument> documents, String nextPageToken) {
    static DocumentPage fromProto(ListDocumentsResponse r) {
      return new DocumentPage(r.getDocumentsList().stream().map(StoredDocument::fromProto).toList(),
          r.getNextPageToken());
    }
  }

  /**
   * What {@link #upsertDocuments} did.
   *
   * @param inserted documents whose id was new
   * @param replaced documents whose id existed and whose text or metadata changed
   * @param unchanged documents whose id existed with identical text and metadata (nothing re-indexed)
   * @param documentCount documents the source holds in the scope after the call
   */
  public record UpsertResult(int inserted, int replaced, int unchanged, int documentCount) {
    static UpsertResult fromProto(UpsertDocumentsResponse r) {
      return new UpsertResult(r.getInserted(), r.getReplaced(), r.getUnchanged(), r.getDocumentCount());
    }
  }

  /**
   * What {@link #deleteDocuments} did.
   *
   * @param deleted documents deleted
   * @param notFound ids that were not present (repeats in the request count once)
   * @param documentCount documents the source holds in the scope after the call
   */
  public record DeleteResult(int deleted, int notFound, int documentCount) {
    static DeleteResult fromProto(DeleteDocumentsResponse r) {
      return new DeleteResult(r.getDeleted(), r.getNotFound(), r.getDocumentCount());
    }
  }

  // ---- internals ------------------------------------------------------------------------------------------------

  private <Q, R, T> CompletableFuture<T> async(MethodDescriptor<Q, R> method, Supplier<Q> request,
      Function<R, T> convert) {
    return context.callAsync(method, request, timeout, convert);
  }

  // The requests of the plain overloads: scoped like any request when they are sent.

  private static ValidateConfigurationRequest declarationsCheck(Target target) {
    return ValidateConfigurationRequest.newBuilder().setTarget(Objects.requireNonNull(target, "target"))
        .setDeclarationsOnly(true).build();
  }

  private static ValidateConfigurationRequest budgetCheck(Target target, Llm llm) {
    return ValidateConfigurationRequest.newBuilder().setTarget(Objects.requireNonNull(target, "target"))
        .setLlm(Objects.requireNonNull(llm, "llm")).build();
  }

  private static EnforceRequest enforceRequest(Target target, String action, Map<String, ?> params, Llm llm) {
    EnforceRequest.Builder request = EnforceRequest.newBuilder().setTarget(Objects.requireNonNull(target, "target"))
        .setAction(Objects.requireNonNull(action, "action"))
        .addAllParams(RetrievalRequests.params(Objects.requireNonNull(params, "params")));
    return (llm == null ? request : request.setLlm(llm)).build();
  }

  private static RequireLoadedRequest loadRequest(Target target, String... names) {
    return RequireLoadedRequest.newBuilder().setTarget(Objects.requireNonNull(target, "target"))
        .addAllNames(List.of(names)).build();
  }

  private static RequireReadyRequest readyRequest(Target target, Map<String, String> resolvedPaths) {
    return RequireReadyRequest.newBuilder().setTarget(Objects.requireNonNull(target, "target"))
        .putAllResolvedPaths(Objects.requireNonNull(resolvedPaths, "resolvedPaths")).build();
  }

  private static SearchRequest.Builder searchRequest(Target target, String query, int topK) {
    if (topK < 1) {
      throw new IllegalArgumentException("topK must be at least 1: " + topK);
    }
    return SearchRequest.newBuilder().setTarget(Objects.requireNonNull(target, "target"))
        .setQuery(Objects.requireNonNull(query, "query")).setTopK(topK);
  }

  private static SearchRequest searchRequest(Target target, String query, int topK, SearchOptions options) {
    return searchRequest(target, query, topK).setSearch(Objects.requireNonNull(options, "options")).build();
  }

  private static ListDocumentsRequest listRequest(String knowledge, Filter filter, int pageSize, String pageToken) {
    if (pageSize < 0) {
      throw new IllegalArgumentException("pageSize must not be negative: " + pageSize);
    }
    ListDocumentsRequest.Builder request = ListDocumentsRequest.newBuilder()
        .setKnowledge(Objects.requireNonNull(knowledge, "knowledge")).setPageSize(pageSize)
        .setPageToken(pageToken == null ? "" : pageToken);
    return (filter == null ? request : request.setFilter(filter)).build();
  }

  static LinkedHashMap<String, Integer> counts(List<SourceCount> counts) {
    LinkedHashMap<String, Integer> out = new LinkedHashMap<>();
    for (SourceCount c : counts) {
      out.put(c.getName(), c.getCount());
    }
    return out;
  }

  private ValidateConfigurationRequest scoped(ValidateConfigurationRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private EnforceRequest scoped(EnforceRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private RequireLoadedRequest scoped(RequireLoadedRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private RequireReadyRequest scoped(RequireReadyRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private PrepareChatKnowledgeRequest scoped(PrepareChatKnowledgeRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private SearchRequest scoped(SearchRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private UpsertDocumentsRequest scoped(UpsertDocumentsRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private DeleteDocumentsRequest scoped(DeleteDocumentsRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private GetDocumentsRequest scoped(GetDocumentsRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private ListDocumentsRequest scoped(ListDocumentsRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  @Override
  public String toString() {
    return "SidecarRetrieval[" + (scope == null ? "unscoped" : scope.tenant() + "/" + scope.session())
        + (timeout == null ? "" : ", timeout=" + timeout) + "]";
  }
}
