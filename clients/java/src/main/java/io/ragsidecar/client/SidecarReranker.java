package io.ragsidecar.client;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import io.ragsidecar.v1.ListModelsRequest;
import io.ragsidecar.v1.ListModelsResponse;
import io.ragsidecar.v1.RerankDocument;
import io.ragsidecar.v1.RerankRequest;
import io.ragsidecar.v1.RerankResponse;
import io.ragsidecar.v1.RerankResult;
import io.ragsidecar.v1.RerankerServiceGrpc;

/**
 * The {@link Reranker} backed by the sidecar's {@code RerankerService}; obtained from
 * {@link RagSidecarClient#reranker()}. Thread-safe and shared: it keeps no per-request state.
 *
 * <p>{@link #supports(String)} reads the latest {@link ModelSnapshot}, which a daemon thread of the client refreshes
 * with {@code ListModels} every {@linkplain RagSidecarClient.Builder#modelRefreshInterval(Duration) refresh interval}
 * (and, until the first answer arrives, at least every second, reconnecting at once, so that a sidecar started after
 * the host is noticed promptly). Until then it answers {@code false}:
 * {@link RagSidecarClient.Builder#awaitReady(Duration)} makes {@code build()} wait for it.
 */
public final class SidecarReranker implements Reranker {
  private static final System.Logger LOG = System.getLogger(SidecarReranker.class.getName());
  private static final Duration FIRST_RETRY = Duration.ofMillis(250);
  /** Longest wait between two attempts while there is no snapshot yet. */
  private static final Duration MAX_RETRY_BEFORE_FIRST_SNAPSHOT = Duration.ofSeconds(1);
  private static final Duration LIST_MODELS_TIMEOUT = Duration.ofSeconds(10);

  private final ClientContext context;
  private final ScheduledExecutorService scheduler;
  private final Duration refreshInterval;
  private final Runnable reconnectNow;
  private final CompletableFuture<ModelSnapshot> firstSnapshot = new CompletableFuture<>();
  private volatile ModelSnapshot snapshot;
  private volatile boolean lastRefreshFailed;

  /** {@code reconnectNow} cuts the channel's reconnect back-off short (it grows to minutes otherwise). */
  SidecarReranker(ClientContext context, ScheduledExecutorService scheduler, Duration refreshInterval,
      Runnable reconnectNow) {
    this.context = context;
    this.scheduler = scheduler;
    this.refreshInterval = refreshInterval;
    this.reconnectNow = reconnectNow;
  }

  /** Starts the background refresh of the model snapshot; called once by the client. */
  void start() {
    schedule(Duration.ZERO, FIRST_RETRY);
  }

  private void schedule(Duration delay, Duration backoff) {
    try {
      scheduler.schedule(() -> refreshInBackground(backoff), delay.toNanos(), TimeUnit.NANOSECONDS);
    } catch (RejectedExecutionException closed) {
      // The client is closing.
    }
  }

  private void refreshInBackground(Duration backoff) {
    if (snapshot == null) {
      reconnectNow.run();
    }
    try {
      refreshModels();
      schedule(refreshInterval, FIRST_RETRY);
    } catch (RuntimeException failure) {
      if (!lastRefreshFailed) {
        LOG.log(snapshot == null ? Level.DEBUG : Level.WARNING,
            "ragsidecar: ListModels failed, keeping the previous model snapshot: " + failure.getMessage());
      }
      lastRefreshFailed = true;
      Duration cap = snapshot == null && MAX_RETRY_BEFORE_FIRST_SNAPSHOT.compareTo(refreshInterval) < 0
          ? MAX_RETRY_BEFORE_FIRST_SNAPSHOT : refreshInterval;
      Duration next = backoff.multipliedBy(2);
      schedule(backoff, next.compareTo(cap) > 0 ? cap : next);
    }
  }

  @Override
  public boolean supports(String model) {
    ModelSnapshot current = snapshot;
    return current != null && current.supports(model);
  }

  /** The latest model snapshot; empty until the first {@code ListModels} answer. Never a network call. */
  public Optional<ModelSnapshot> models() {
    return Optional.ofNullable(snapshot);
  }

  /**
   * Waits up to {@code timeout} for the first model snapshot (for hosts that want {@link #supports(String)} to be
   * meaningful before they start), and returns it.
   *
   * @throws DeadlineExceededException when no snapshot arrived in time
   */
  public ModelSnapshot awaitModels(Duration timeout) {
    ModelSnapshot current = snapshot;
    if (current != null) {
      return current;
    }
    try {
      return firstSnapshot.get(timeout.toNanos(), TimeUnit.NANOSECONDS);
    } catch (TimeoutException e) {
      throw ErrorDetails.toException(io.grpc.Status.DEADLINE_EXCEEDED
          .withDescription("no model snapshot from the sidecar within " + timeout).asRuntimeException());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw ErrorDetails.toException(io.grpc.Status.CANCELLED.withDescription("interrupted").withCause(e)
          .asRuntimeException());
    } catch (ExecutionException e) {
      throw ErrorDetails.toException(e.getCause());
    }
  }

  /**
   * Fetches the model list now, on the calling thread (a network call, unlike {@link #supports(String)}), and
   * makes it the current snapshot.
   */
  public ModelSnapshot refreshModels() {
    return refreshModels(LIST_MODELS_TIMEOUT);
  }

  /** {@link #refreshModels()} with at most this timeout (and at most the client's default deadline). */
  ModelSnapshot refreshModels(Duration atMost) {
    Duration probe = context.deadline(CallKind.PROBE);
    Duration timeout = probe.compareTo(atMost) < 0 ? probe : atMost;
    ListModelsResponse response =
        context.call(RerankerServiceGrpc.getListModelsMethod(), ListModelsRequest.getDefaultInstance(), timeout);
    List<ModelInfo> models = new ArrayList<>(response.getModelsCount());
    response.getModelsList().forEach(m -> models.add(ModelInfo.fromProto(m)));
    ModelSnapshot fresh = new ModelSnapshot(models, response.getGeneration(), response.getLastReloadError(),
        Instant.now());
    synchronized (this) {
      ModelSnapshot current = snapshot;
      if (current == null || !fresh.fetchedAt().isBefore(current.fetchedAt())) {
        snapshot = fresh;
      }
    }
    lastRefreshFailed = false;
    firstSnapshot.complete(fresh);
    return fresh;
  }

  @Override
  public List<RankedDocument> rerank(Request request) {
    RerankResponse response = context.call(RerankerServiceGrpc.getRerankMethod(), toProto(request),
        request.timeout().orElse(null));
    return fromProto(request, response);
  }

  @Override
  public CompletableFuture<List<RankedDocument>> rerankAsync(Request request) {
    RerankRequest proto;
    try {
      proto = toProto(request);
    } catch (RuntimeException invalid) {
      return CompletableFuture.failedFuture(invalid);
    }
    CompletableFuture<RerankResponse> call =
        context.callAsync(RerankerServiceGrpc.getRerankMethod(), proto, request.timeout().orElse(null));
    CompletableFuture<List<RankedDocument>> result = call.thenApply(response -> fromProto(request, response));
    result.whenComplete((value, failure) -> {
      if (result.isCancelled()) {
        call.cancel(false);
      }
    });
    return result;
  }

  static RerankRequest toProto(Request request) {
    RerankRequest.Builder b = RerankRequest.newBuilder()
        .setQuery(request.query())
        .setReturnDocuments(request.returnDocuments());
    request.model().ifPresent(b::setModel);
    request.topN().ifPresent(b::setTopN);
    request.maxDocumentTokens().ifPresent(b::setMaxDocumentTokens);
    request.longDocumentStrategy().ifPresent(s -> b.setLongDocumentStrategy(s.toProto()));
    request.minRelevanceScore().ifPresent(b::setMinRelevanceScore);
    for (Document d : request.documents()) {
      b.addDocuments(RerankDocument.newBuilder().setId(d.id()).setText(d.text()).putAllMetadata(d.metadata()));
    }
    return b.build();
  }

  /**
   * Converts the response and checks the SPI invariant: every result references a document of the request, at
   * most once, with the id it was sent with. Then applies {@code topN}, as the host runtime does.
   */
  static List<RankedDocument> fromProto(Request request, RerankResponse response) {
    List<Document> documents = request.documents();
    boolean[] seen = new boolean[documents.size()];
    List<RankedDocument> out = new ArrayList<>(response.getResultsCount());
    for (RerankResult r : response.getResultsList()) {
      long index = Integer.toUnsignedLong(r.getIndex());
      if (index >= documents.size()) {
        throw new ContractViolationException("rerank result references documents[" + index + "] but the request has "
            + documents.size() + " documents");
      }
      int i = (int) index;
      if (seen[i]) {
        throw new ContractViolationException("rerank results reference documents[" + i + "] more than once");
      }
      seen[i] = true;
      Document sent = documents.get(i);
      if (!sent.id().equals(r.getId())) {
        throw new ContractViolationException("rerank result for documents[" + i + "] has id '" + r.getId()
            + "' but the request sent '" + sent.id() + "'");
      }
      Document echoed = null;
      if (r.hasDocument()) {
        echoed = new Document(r.getDocument().getId(), r.getDocument().getText(), r.getDocument().getMetadataMap());
        if (!echoed.equals(sent)) {
          throw new ContractViolationException("rerank result for documents[" + i
              + "] echoes a document that differs from the one sent");
        }
      }
      out.add(new RankedDocument(i, r.getId(), r.getRelevanceScore(), r.getRawScore(), echoed, r.getBestWindow()));
    }
    int topN = request.topN().orElse(Integer.MAX_VALUE);
    if (topN >= 0 && out.size() > topN) {
      return List.copyOf(out.subList(0, topN));
    }
    return List.copyOf(out);
  }

  @Override
  public String toString() {
    return "SidecarReranker[models=" + (snapshot == null ? "unknown" : snapshot.models().size()) + "]";
  }
}
