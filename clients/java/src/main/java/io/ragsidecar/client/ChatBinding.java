package io.ragsidecar.client;

import java.time.Duration;
import java.util.Arrays;
import java.util.Collection;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.atomic.AtomicReference;
import io.ragsidecar.v1.AppendToBindingRequest;
import io.ragsidecar.v1.AppendToBindingResponse;
import io.ragsidecar.v1.CloseBindingRequest;
import io.ragsidecar.v1.InvalidateBindingRequest;
import io.ragsidecar.v1.InvalidateBindingResponse;
import io.ragsidecar.v1.TurnBinding;
import io.ragsidecar.v1.ChatKnowledgeServiceGrpc;
import io.ragsidecar.v1.Principal;
import io.ragsidecar.v1.Scope;
import io.ragsidecar.v1.MemoryDocument;

/**
 * An open chat binding: one owner's live corpus of one source, held by the sidecar, bound to the tenant and session it
 * was opened in. Obtained from {@link SidecarChat#openBinding}; a turn uses it through {@link #turnBinding()}.
 *
 * <pre>{@code
 * try (ChatBinding log = chat.openBinding("narrator-7", "simulation-logs")) {
 *   log.append(List.of(RetrievalRequests.document("e1", "Episode 1: the kettle was dropped.")));
 *   GroundedTurn turn = chat.groundTurn(request.toBuilder().addBindings(log.turnBinding()).build());
 * }   // CloseBinding: the sidecar releases the corpus
 * }</pre>
 *
 * <p>Every call carries the principal, scope and owner id the binding was opened with, and the binding's handle: the
 * secret OpenBinding returned, the out-of-process stand-in for the host's reference identity of its owner. Only this
 * object holds it (no accessor, not in {@link #toString()}), so only the code that opened the binding, or code it
 * hands this object to, can use the binding, as its owner, in its tenant and session. Thread-safe.
 *
 * <p>{@link #close()} is idempotent: the first call closes the binding on the sidecar, later ones (and concurrent
 * ones) wait for that call and send nothing. Bindings live in the sidecar's memory: after {@code close} or a sidecar
 * restart, {@link #append}, {@link #invalidate} and turns that use the binding fail with
 * {@link UnknownBindingException}; the host then opens a new binding and appends its documents again.
 */
public final class ChatBinding implements AutoCloseable {
  private final ClientContext context;
  private final Duration timeout;
  private final Principal principal;
  private final Scope scope;
  private final String id;
  // The secret OpenBinding returned: presented on every call, never shown (not in toString, not by an accessor).
  private final String handle;
  private final String ownerId;
  private final String source;
  private final int topK;
  private final boolean declared;
  private final AtomicReference<CompletableFuture<Boolean>> closing = new AtomicReference<>();

  ChatBinding(ClientContext context, Duration timeout, Principal principal, Scope scope, String id, String handle,
      String ownerId, String source, int topK, boolean declared) {
    this.context = context;
    this.timeout = timeout;
    this.principal = principal;
    this.scope = scope;
    this.id = id;
    this.handle = handle;
    this.ownerId = ownerId;
    this.source = source;
    this.topK = topK;
    this.declared = declared;
  }

  /**
   * The binding's id: opaque, unique for the sidecar's life. Not a secret (the sidecar logs it): using the binding
   * also takes the handle OpenBinding returned, which this object keeps to itself and presents on every call.
   */
  public String id() {
    return id;
  }

  /** The owner that may use it. */
  public String ownerId() {
    return ownerId;
  }

  /** The source name it searches. */
  public String source() {
    return source;
  }

  /** Most hits a search gives ({@code 5} when it was opened without one). */
  public int topK() {
    return topK;
  }

  /** Whether it is checked against its owner's declared SEARCH entry (otherwise an undeclared, application source). */
  public boolean declared() {
    return declared;
  }

  /** The tenant and session it is bound to. */
  public Scope scope() {
    return scope;
  }

  /**
   * The turn's reference to this binding, for {@code GroundTurnRequest.Builder.addBindings}. It carries the binding's
   * secret handle: send it, do not log it. A {@link ChatTurn} takes the binding itself instead.
   */
  public TurnBinding turnBinding() {
    return TurnBinding.newBuilder().setBindingId(id).setOwnerId(ownerId).setBindingHandle(handle).build();
  }

  // ---- AppendToBinding ------------------------------------------------------------------------------------------

  /**
   * Adds documents to the live corpus (an existing id is replaced); the next search sees them.
   *
   * @throws ValidationException no documents, an empty or repeated id, a blank text ({@code INVALID_REQUEST}), or
   *     more documents than the sidecar's limit ({@code LIMIT_EXCEEDED})
   * @throws UnknownBindingException when the binding is no longer open
   */
  public AppendResult append(Collection<MemoryDocument> documents) {
    return AppendResult.fromProto(
        context.call(ChatKnowledgeServiceGrpc.getAppendToBindingMethod(), appendRequest(documents), timeout));
  }

  /** {@link #append(Collection)} of these documents. */
  public AppendResult append(MemoryDocument... documents) {
    return append(Arrays.asList(documents));
  }

  /** Asynchronous {@link #append(Collection)}. */
  public CompletableFuture<AppendResult> appendAsync(Collection<MemoryDocument> documents) {
    return context.callAsync(ChatKnowledgeServiceGrpc.getAppendToBindingMethod(), () -> appendRequest(documents),
        timeout, AppendResult::fromProto);
  }

  private AppendToBindingRequest appendRequest(Collection<MemoryDocument> documents) {
    return AppendToBindingRequest.newBuilder().setPrincipal(principal).setScope(scope).setBindingId(id)
        .setBindingHandle(handle).setOwnerId(ownerId).addAllDocuments(Objects.requireNonNull(documents, "documents")).build();
  }

  // ---- InvalidateBinding ----------------------------------------------------------------------------------------

  /**
   * Makes the next search see the corpus as it now is (drops cached results, rebuilds what is stale), keeping its
   * documents. Returns the documents the corpus holds.
   */
  public int invalidate() {
    return invalidate(false);
  }

  /** Empties the corpus (an episode, run or reset transition). Returns the documents it holds: 0. */
  public int reset() {
    return invalidate(true);
  }

  /** {@link #invalidate()} or, with {@code reset}, {@link #reset()}. */
  public int invalidate(boolean reset) {
    return context.call(ChatKnowledgeServiceGrpc.getInvalidateBindingMethod(), invalidateRequest(reset), timeout)
        .getDocumentCount();
  }

  /** Asynchronous {@link #invalidate(boolean)}. */
  public CompletableFuture<Integer> invalidateAsync(boolean reset) {
    return context.callAsync(ChatKnowledgeServiceGrpc.getInvalidateBindingMethod(), () -> invalidateRequest(reset),
        timeout, InvalidateBindingResponse::getDocumentCount);
  }

  private InvalidateBindingRequest invalidateRequest(boolean reset) {
    return InvalidateBindingRequest.newBuilder().setPrincipal(principal).setScope(scope).setBindingId(id)
        .setBindingHandle(handle).setOwnerId(ownerId).setReset(reset).build();
  }

  // ---- CloseBinding ---------------------------------------------------------------------------------------------

  /** Whether {@link #close()} (or {@link #closeAsync()}) completed. */
  public boolean isClosed() {
    CompletableFuture<Boolean> done = closing.get();
    return done != null && done.isDone() && !done.isCompletedExceptionally();
  }

  /**
   * Releases the binding and its corpus on the sidecar. Idempotent: only the first call is sent; a failed close (the
   * sidecar unreachable, for example) may be retried.
   */
  @Override
  public void close() {
    CompletableFuture<Boolean> mine = new CompletableFuture<>();
    if (!closing.compareAndSet(null, mine)) {
      await(closing.get());
      return;
    }
    try {
      mine.complete(context.call(ChatKnowledgeServiceGrpc.getCloseBindingMethod(), closeRequest(), timeout)
          .getWasOpen());
    } catch (RuntimeException failure) {
      closing.compareAndSet(mine, null);
      mine.completeExceptionally(failure);
      throw failure;
    }
  }

  /**
   * Asynchronous {@link #close()}. The future completes with {@code true} when the binding was open on the sidecar
   * when the first close reached it (false when it was already gone, for example after a restart); later calls
   * return the first call's outcome.
   */
  public CompletableFuture<Boolean> closeAsync() {
    CompletableFuture<Boolean> mine = new CompletableFuture<>();
    if (!closing.compareAndSet(null, mine)) {
      return closing.get().copy();
    }
    context.callAsync(ChatKnowledgeServiceGrpc.getCloseBindingMethod(), closeRequest(), timeout)
        .whenComplete((response, failure) -> {
          if (failure == null) {
            mine.complete(response.getWasOpen());
          } else {
            closing.compareAndSet(mine, null);
            mine.completeExceptionally(failure);
          }
        });
    return mine.copy();
  }

  private CloseBindingRequest closeRequest() {
    return CloseBindingRequest.newBuilder().setPrincipal(principal).setScope(scope).setBindingId(id)
        .setBindingHandle(handle).setOwnerId(ownerId).build();
  }

  private static void await(CompletableFuture<Boolean> close) {
    try {
      close.join();
    } catch (CompletionException failure) {
      if (failure.getCause() instanceof RuntimeException cause) {
        throw cause;
      }
      throw failure;
    }
  }

  @Override
  public String toString() {
    return "ChatBinding[" + ownerId + "/" + source + " in " + scope.getTenant() + "/" + scope.getSession()
        + (isClosed() ? ", closed" : "") + "]";
  }

  /**
   * What {@link ChatBinding#append} did.
   *
   * @param appended documents whose id was new to the corpus
   * @param replaced documents whose id existed and were replaced
   * @param documentCount documents the corpus holds after the call
   */
  public record AppendResult(int appended, int replaced, int documentCount) {
    static AppendResult fromProto(AppendToBindingResponse r) {
      return new AppendResult(r.getAppended(), r.getReplaced(), r.getDocumentCount());
    }
  }
}
