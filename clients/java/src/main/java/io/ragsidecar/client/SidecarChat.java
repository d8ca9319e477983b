package io.ragsidecar.client;

import java.time.Duration;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import io.ragsidecar.v1.AppendToBindingRequest;
import io.ragsidecar.v1.CloseBindingRequest;
import io.ragsidecar.v1.CloseBindingResponse;
import io.ragsidecar.v1.GroundTurnRequest;
import io.ragsidecar.v1.InvalidateBindingRequest;
import io.ragsidecar.v1.InvalidateBindingResponse;
import io.ragsidecar.v1.OpenBindingRequest;
import io.ragsidecar.v1.OpenBindingResponse;
import io.ragsidecar.v1.ChatKnowledgeServiceGrpc;

/**
 * The sidecar's {@code ChatKnowledgeService}: owner-aware grounding of chat turns (the grounding side of the host's
 * {@code SCOPBridge.sendToLLM(ChatTurn)}; the host keeps the LLM call) and the chat bindings whose live corpora the
 * owners' searches go through. Obtained from {@link RagSidecarClient#chat()}.
 *
 * <pre>{@code
 * SidecarChat chat = client.chat().withScope(new KnowledgeScope("agent-host", "tenant-a", "session-42"));
 * try (ChatBinding log = chat.openBinding("narrator-7", "simulation-logs")) {
 *   log.append(List.of(RetrievalRequests.document("e1", "Episode 4: the bridge collapsed.")));
 *   GroundedTurn turn = chat.groundTurn(ChatTurn.builder(storedConversation)   // never changed by the sidecar
 *       .owners(ChatRequests.owner("narrator-7", stateText,
 *           RetrievalRequests.memory("simulation-logs", KnowledgeUse.KNOWLEDGE_USE_SEARCH).build()))
 *       .bindings(log)
 *       .context(ChatRequests.context().setRunId("run-9"))     // with a context, knowledge is given and searched
 *       .llm(RetrievalRequests.llm("gpt-4o"))
 *       .build());                                            // a malformed turn: ValidationException
 *   send(turn.conversation());                                  // the outbound copy, grounded
 * }
 * }</pre>
 *
 * <p>A turn is a {@link ChatTurn} or a raw {@code GroundTurnRequest}; the sidecar checks either, with the same
 * rules and violations; other requests are the generated messages in {@code io.ragsidecar.v1} ({@link ChatRequests}
 * builds the common parts). Every request needs a principal, and most a scope: {@link #withScope(KnowledgeScope)} returns a
 * facade that sets the principal of every request and its scope (for {@code GroundTurn}: the turn's own scope and the
 * scope of its {@code context}, when it has one), replacing what the request carried. A {@link ChatBinding} keeps the principal
 * and scope it was opened with.
 *
 * <p>Immutable and thread-safe: {@code withScope} and {@code withTimeout} return new facades on the same channel.
 * Every method has an {@code ...Async} variant whose future fails with the same {@link RagSidecarException} the
 * blocking one throws; cancelling the future cancels the call.
 *
 * <p>Errors: {@link PermissionDeniedException} (no principal, or a binding used with another owner id, in another
 * tenant or session than it was opened in, or without its handle), {@link UnknownBindingException} (a binding id that is not open: closed,
 * never opened, or lost in a sidecar restart), {@link ValidationException} (a malformed turn or request, with one
 * {@linkplain ValidationException#violations() violation} per problem, such as an owner listed twice or a binding
 * that does not match its owner's declared entry; {@code LIMIT_EXCEEDED} for too many appended documents),
 * {@link FailedPreconditionException} ({@code DIRECT_BUDGET_EXCEEDED}, {@code UNKNOWN_MODEL_WINDOW},
 * {@code SOURCE_UNREADABLE}). Retrieval trouble of one owner is not an error: the turn fails open for that owner and
 * says so in its {@link GroundedTurn.OwnerOutcome}.
 */
public final class SidecarChat {
  /** The {@code top_k} of a binding opened without one. */
  public static final int DEFAULT_TOP_K = 5;

  private final ClientContext context;
  private final KnowledgeScope scope;
  private final Duration timeout;

  SidecarChat(ClientContext context) {
    this(context, null, null);
  }

  private SidecarChat(ClientContext context, KnowledgeScope scope, Duration timeout) {
    this.context = context;
    this.scope = scope;
    this.timeout = timeout;
  }

  /**
   * A facade that sets this principal on every request and this scope on every request (a turn's own scope, and the
   * scope of its {@code context} when it has one), replacing the request's own.
   */
  public SidecarChat withScope(KnowledgeScope scope) {
    return new SidecarChat(context, Objects.requireNonNull(scope, "scope"), timeout);
  }

  /** A facade whose calls (and the calls of the bindings it opens) use this deadline instead of the default one. */
  public SidecarChat withTimeout(Duration timeout) {
    if (timeout.isNegative() || timeout.isZero()) {
      throw new IllegalArgumentException("timeout must be positive: " + timeout);
    }
    return new SidecarChat(context, scope, timeout);
  }

  /** The scope this facade applies to every call; empty when requests carry their own. */
  public Optional<KnowledgeScope> scope() {
    return Optional.ofNullable(scope);
  }

  // ---- GroundTurn -----------------------------------------------------------------------------------------------

  /**
   * Builds the outbound conversation of one chat turn: a copy of the request's conversation with earlier
   * sidecar-marked regions removed, the request section and every owner's state added to its last system message,
   * and, with a context, the owners' DIRECT knowledge and SEARCH evidence (searched through the turn's bindings with
   * the latest user message) inside the {@code <tnsai-memory>} fence. Fails open per owner: an owner whose search
   * fails, finds nothing or does not fit is dispatched without its evidence, and the result says why.
   */
  public GroundedTurn groundTurn(GroundTurnRequest request) {
    return GroundedTurn.fromProto(
        context.call(ChatKnowledgeServiceGrpc.getGroundTurnMethod(), scoped(request), timeout));
  }

  /** Asynchronous {@link #groundTurn(GroundTurnRequest)}. */
  public CompletableFuture<GroundedTurn> groundTurnAsync(GroundTurnRequest request) {
    return context.callAsync(ChatKnowledgeServiceGrpc.getGroundTurnMethod(), () -> scoped(request), timeout,
        GroundedTurn::fromProto);
  }

  /**
   * {@link #groundTurn(GroundTurnRequest)} of a {@linkplain ChatTurn.Builder#build() built} turn, with this facade's
   * principal (a scoped facade is required, or use {@link #groundTurn(ChatTurn,
   * io.ragsidecar.v1.Principal)}).
   */
  public GroundedTurn groundTurn(ChatTurn turn) {
    return groundTurn(request(turn, null));
  }

  /** {@link #groundTurn(ChatTurn)} as this principal (an unscoped facade). */
  public GroundedTurn groundTurn(ChatTurn turn, io.ragsidecar.v1.Principal principal) {
    return groundTurn(request(turn, Objects.requireNonNull(principal, "principal")));
  }

  /** Asynchronous {@link #groundTurn(ChatTurn)}. */
  public CompletableFuture<GroundedTurn> groundTurnAsync(ChatTurn turn) {
    return groundTurnAsync(request(turn, null));
  }

  private GroundTurnRequest request(ChatTurn turn, io.ragsidecar.v1.Principal principal) {
    GroundTurnRequest.Builder b = Objects.requireNonNull(turn, "turn").request();
    if (principal != null) {
      b.setPrincipal(principal);
    }
    return b.build();
  }

  // ---- OpenBinding ----------------------------------------------------------------------------------------------

  /**
   * Opens a declared binding of this owner to its enabled SEARCH entry {@code source}, with the default
   * {@code top_k} ({@value #DEFAULT_TOP_K}; it must equal the entry's), in this facade's scope.
   */
  public ChatBinding openBinding(String ownerId, String source) {
    return openBinding(OpenBindingRequest.newBuilder().setOwnerId(ownerId).setSource(source).setDeclared(true)
        .build());
  }

  /** Opens a declared binding with this {@code top_k}, which must equal the owner's entry's. */
  public ChatBinding openBinding(String ownerId, String source, int topK) {
    return openBinding(OpenBindingRequest.newBuilder().setOwnerId(ownerId).setSource(source).setTopK(topK)
        .setDeclared(true).build());
  }

  /**
   * Opens a binding with an empty live corpus, bound to the request's tenant and session. Whether a declared binding
   * matches its owner's entries is checked when a turn uses it, not here.
   */
  public ChatBinding openBinding(OpenBindingRequest request) {
    OpenBindingRequest sent = scoped(request);
    return binding(sent, context.call(ChatKnowledgeServiceGrpc.getOpenBindingMethod(), sent, timeout));
  }

  /** Asynchronous {@link #openBinding(OpenBindingRequest)}. */
  public CompletableFuture<ChatBinding> openBindingAsync(OpenBindingRequest request) {
    OpenBindingRequest sent;
    try {
      sent = scoped(request);
    } catch (RuntimeException invalid) {
      return CompletableFuture.failedFuture(invalid);
    }
    return context.callAsync(ChatKnowledgeServiceGrpc.getOpenBindingMethod(), () -> sent, timeout,
        response -> binding(sent, response));
  }

  private ChatBinding binding(OpenBindingRequest sent, OpenBindingResponse response) {
    return new ChatBinding(context, timeout, sent.getPrincipal(), sent.getScope(), response.getBindingId(),
        response.getBindingHandle(), sent.getOwnerId(), sent.getSource(), sent.hasTopK() ? sent.getTopK() : DEFAULT_TOP_K, sent.getDeclared());
  }

  // ---- Binding calls by id --------------------------------------------------------------------------------------

  /**
   * AppendToBinding by id, for a binding this process holds no {@link ChatBinding} for; prefer
   * {@link ChatBinding#append}. The request must carry the binding's {@code binding_handle} (the secret OpenBinding
   * returned; {@link ChatBinding#turnBinding()} of the opening process carries it), like InvalidateBinding and
   * CloseBinding by id: owner id, tenant and session are not enough.
   */
  public ChatBinding.AppendResult appendToBinding(AppendToBindingRequest request) {
    return ChatBinding.AppendResult.fromProto(
        context.call(ChatKnowledgeServiceGrpc.getAppendToBindingMethod(), scoped(request), timeout));
  }

  /** Asynchronous {@link #appendToBinding(AppendToBindingRequest)}. */
  public CompletableFuture<ChatBinding.AppendResult> appendToBindingAsync(AppendToBindingRequest request) {
    return context.callAsync(ChatKnowledgeServiceGrpc.getAppendToBindingMethod(), () -> scoped(request), timeout,
        ChatBinding.AppendResult::fromProto);
  }

  /** InvalidateBinding by id; returns the documents the corpus holds. Prefer {@link ChatBinding#invalidate}. */
  public int invalidateBinding(InvalidateBindingRequest request) {
    return context.call(ChatKnowledgeServiceGrpc.getInvalidateBindingMethod(), scoped(request), timeout)
        .getDocumentCount();
  }

  /** Asynchronous {@link #invalidateBinding(InvalidateBindingRequest)}. */
  public CompletableFuture<Integer> invalidateBindingAsync(InvalidateBindingRequest request) {
    return context.callAsync(ChatKnowledgeServiceGrpc.getInvalidateBindingMethod(), () -> scoped(request), timeout,
        InvalidateBindingResponse::getDocumentCount);
  }

  /**
   * CloseBinding by id; returns whether it was open. Idempotent: an id that is not open gives {@code false}. Prefer
   * {@link ChatBinding#close()}.
   */
  public boolean closeBinding(CloseBindingRequest request) {
    return context.call(ChatKnowledgeServiceGrpc.getCloseBindingMethod(), scoped(request), timeout).getWasOpen();
  }

  /** Asynchronous {@link #closeBinding(CloseBindingRequest)}. */
  public CompletableFuture<Boolean> closeBindingAsync(CloseBindingRequest request) {
    return context.callAsync(ChatKnowledgeServiceGrpc.getCloseBindingMethod(), () -> scoped(request), timeout,
        CloseBindingResponse::getWasOpen);
  }

  // ---- internals ------------------------------------------------------------------------------------------------

  private GroundTurnRequest scoped(GroundTurnRequest r) {
    Objects.requireNonNull(r, "request");
    if (scope == null) {
      return r;
    }
    GroundTurnRequest.Builder b = r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope());
    if (r.hasContext()) {
      b.getContextBuilder().setScope(scope.scope());
    }
    return b.build();
  }

  private OpenBindingRequest scoped(OpenBindingRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private AppendToBindingRequest scoped(AppendToBindingRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private InvalidateBindingRequest scoped(InvalidateBindingRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  private CloseBindingRequest scoped(CloseBindingRequest r) {
    Objects.requireNonNull(r, "request");
    return scope == null ? r : r.toBuilder().setPrincipal(scope.principal()).setScope(scope.scope()).build();
  }

  @Override
  public String toString() {
    return "SidecarChat[" + (scope == null ? "unscoped" : scope.tenant() + "/" + scope.session())
        + (timeout == null ? "" : ", timeout=" + timeout) + "]";
  }
}
