// The ChatKnowledgeService facade: owner-aware grounding of chat turns and the chat bindings' live corpora.
// Plain typed objects in, plain typed objects out, typed errors; a binding is a handle that `await using`
// closes.
import type { JsonObject } from "@bufbuild/protobuf";
import { timestampFromDate, timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { Client } from "@connectrpc/connect";
import {
  ActivityKind,
  ChatKnowledgeService,
  FailOpenReason,
  OwnerSearch,
  TurnGrounding,
  type ChatMessage as ChatMessageMessage,
  type OwnerOutcome as OwnerOutcomeMessage,
} from "./gen/ragsidecar/v1/chat_knowledge_pb.js";
import { callMapped, type CallOptions } from "./call.js";
import {
  enumName,
  enumValue,
  fromStale,
  toCaller,
  toEntry,
  toLlm,
  type CallerInit,
  type DirectKnowledgeBlock,
  type KnowledgeEntryInit,
  type LlmInit,
  type MemoryDocumentInit,
  type PrincipalInit,
  type RetrievalTiming,
  type RetrievalUsage,
  type ScopeInit,
  type StaleFallback,
} from "./retrieval.js";
import { toTiming, toUsage } from "./reranker.js";

/** The top_k of a binding opened without one, and of a SEARCH entry that declares none. */
export const CHAT_DEFAULT_TOP_K = 5;

// ---------------------------------------------------------------------------------------------------------
// Requests

/** A message role; the provider's own roles pass through unchanged. */
export type ChatRole = "system" | "user" | "assistant" | "tool" | (string & {});

/** One message of an OpenAI-style conversation, as the host stores it. */
export interface ChatMessageInit {
  readonly role: ChatRole;
  /** The text; null or absent is JSON null (an assistant message that only calls tools). */
  readonly content?: string | null;
  /** Participant name; empty or absent means none. */
  readonly name?: string;
  /** For role "tool": the id of the tool call answered. */
  readonly toolCallId?: string;
  /** Every other key of the message (e.g. `tool_calls`), copied unchanged to the outbound conversation. */
  readonly extra?: JsonObject;
}

/** An owner whose state the turn carries and whose chat knowledge it may give and search. */
export interface ChatOwnerInit {
  /** Required, unique in the turn; the authorization key of the owner's bindings. */
  readonly ownerId: string;
  /** The owner's chat knowledge in declaration order: enabled SEARCH and DIRECT entries count, others are ignored. */
  readonly knowledge?: readonly KnowledgeEntryInit[];
  /** The owner's refreshed state, rendered by the host (the message's `state_text`); written on every turn. */
  readonly state?: string;
}

/**
 * A binding a turn searches through: an id OpenBinding returned and its owner. A `ChatBinding` handle is one,
 * and presents the binding's secret handle itself; a plain object must carry `bindingHandle`.
 */
export interface TurnBindingInit {
  readonly bindingId: string;
  readonly ownerId: string;
  /**
   * The secret OpenBinding returned with the id (PERMISSION_DENIED without it). Leave it out for a
   * ChatBinding handle, which keeps its own out of sight (not a property, not in toJSON or inspection).
   */
  readonly bindingHandle?: string;
}

/** Request-local retrieval context: with it, the owners' knowledge is given and searched. */
export interface ChatRetrievalContextInit {
  /** Tenant (required) and session of the turn; every binding used must belong to it. */
  readonly scope: ScopeInit;
  readonly runId?: string;
  readonly agentName?: string;
  readonly simulationState?: string;
  readonly episode?: string;
  readonly sourceRevision?: string;
  /** Moment (a Date or epoch milliseconds) by which the owners' searches must be done; later owners fail open. */
  readonly deadline?: Date | number;
}

export type ActivityKindName = "SENT" | "RECEIVED" | "ACTED" | "NOTED";

/** One entry of an agent's activity record. */
export interface ActivityEntryInit {
  readonly tick: number | bigint;
  readonly kind: ActivityKindName | ActivityKind;
  /** Peer display name for SENT and RECEIVED. */
  readonly peer?: string;
  /** Message type for SENT and RECEIVED, action name for ACTED. */
  readonly type?: string;
  readonly text?: string;
  readonly failed?: boolean;
}

/** An agent's recent activity; the sidecar renders it as the "## Your recent activity" block. */
export interface ActivityRecordInit {
  /** Oldest first; over a cap the oldest are dropped, the newest always kept. */
  readonly entries?: readonly ActivityEntryInit[];
  /** Default 40. */
  readonly maxEntries?: number;
  /** Default 8000. */
  readonly maxTotalChars?: number;
  /** Default 400; at most maxTotalChars. */
  readonly maxEntryChars?: number;
  /** Folders hidden from every type and text, e.g. `{ path: "/srv/run", replacement: "<run>" }`. */
  readonly redactionRoots?: readonly { readonly path: string; readonly replacement: string }[];
}

export interface GroundTurnInput {
  readonly principal: PrincipalInit;
  /** The stored conversation, oldest first; neither the sidecar nor the client changes it. */
  readonly conversation: readonly ChatMessageInit[];
  /** Owners in render order; none means no state and no knowledge. */
  readonly owners?: readonly ChatOwnerInit[];
  /** Bindings the owners' searches go through, in any order (ChatBinding handles work as they are). */
  readonly bindings?: readonly TurnBindingInit[];
  /** Unset: no knowledge is read (state and request section only). Set with no owners: ValidationError. */
  readonly context?: ChatRetrievalContextInit;
  /**
   * Tenant and session of a turn without a context, which its bindings must belong to (a turn that lists
   * bindings needs this or a context); with a context, unset or equal to the context's scope.
   */
  readonly scope?: ScopeInit;
  /** Added at the end of the last system message, before the owners' state. Blank adds nothing. */
  readonly requestSection?: string;
  /** Rendered and appended to the request section. */
  readonly activity?: ActivityRecordInit;
  /** The model the turn goes to; its input window sizes the DIRECT budgets. */
  readonly llm?: LlmInit;
}

export interface OpenBindingInput extends CallerInit {
  /** The owner that may use the binding. */
  readonly ownerId: string;
  /** The source name the binding searches. */
  readonly source: string;
  /** Most hits a search gives (default 5); a declared binding's must equal its entry's topK. */
  readonly topK?: number;
  /**
   * Default true: the binding serves an enabled SEARCH entry its owner declares (at most one per owner per
   * turn). False: an undeclared binding over the application's own source, a name the owner does not declare.
   */
  readonly declared?: boolean;
}

/** What a binding searches, as it was opened. */
export interface BindingShape {
  readonly source?: string;
  readonly topK?: number;
  readonly declared?: boolean;
}

/** Addresses an open binding: the scope, owner, id and handle it was opened with. */
export interface BindingRefInit extends CallerInit {
  readonly bindingId: string;
  readonly ownerId: string;
  /** The secret OpenBinding returned with the id; required for an open binding (PERMISSION_DENIED otherwise). */
  readonly bindingHandle: string;
}

export interface AppendToBindingInput extends BindingRefInit {
  /** At least one; ids unique in the call; an existing id is replaced. */
  readonly documents: readonly MemoryDocumentInit[];
}

export interface InvalidateBindingInput extends BindingRefInit {
  /** True empties the corpus as well. */
  readonly reset?: boolean;
}

export type CloseBindingInput = BindingRefInit;

// ---------------------------------------------------------------------------------------------------------
// Results

/** A message of the outbound conversation; absent name, toolCallId and extra were empty. */
export interface ChatMessage {
  readonly role: ChatRole;
  readonly content: string | null;
  readonly name?: string;
  readonly toolCallId?: string;
  readonly extra?: JsonObject;
}

export type TurnGroundingName =
  | "GROUNDED"
  | "NO_OWNERS"
  | "NO_CONTEXT"
  | "NO_USER_MESSAGE"
  | "RENDER_FAILED"
  | "NOTHING_GIVEN"
  | "UNSPECIFIED";

export type OwnerSearchName =
  | "GROUNDED"
  | "FAILED_OPEN"
  | "NO_BINDING"
  | "NO_SEARCH_KNOWLEDGE"
  | "NOT_ATTEMPTED"
  | "UNSPECIFIED";

export type FailOpenReasonName = "RETRIEVAL_FAILED" | "EMPTY_RESULT" | "EVIDENCE_OVERSIZED" | "DEADLINE_EXCEEDED";

/** What a turn did for one owner. */
export interface OwnerOutcome {
  readonly ownerId: string;
  readonly search: OwnerSearchName;
  /** Pieces of evidence given; 0 unless search is GROUNDED. */
  readonly documentCount: number;
  /** Why the owner failed open; undefined unless search is FAILED_OPEN. */
  readonly failOpenReason: FailOpenReasonName | undefined;
  /** Human-readable detail of a failure; "" otherwise (not a stable string). */
  readonly detail: string;
  /** Binding sources searched, in order. */
  readonly searchedSources: readonly string[];
  /** The DIRECT blocks given, in declaration order (text empty: it is in the conversation). */
  readonly directBlocks: readonly DirectKnowledgeBlock[];
}

export interface GroundTurnResult {
  /** The outbound conversation, to send to the model as is. */
  readonly conversation: readonly ChatMessage[];
  readonly grounding: TurnGroundingName;
  /** Why rendering failed (RENDER_FAILED); "" otherwise. */
  readonly detail: string;
  /** One outcome per owner, in owner order. */
  readonly owners: readonly OwnerOutcome[];
  readonly staleFallbacks: readonly StaleFallback[];
  readonly usage: RetrievalUsage;
  readonly timing: RetrievalTiming;
}

export interface AppendResult {
  /** Documents whose id was new. */
  readonly appended: number;
  /** Documents whose id existed and were replaced. */
  readonly replaced: number;
  /** Documents the corpus holds after the call. */
  readonly documentCount: number;
}

export interface InvalidateResult {
  /** Documents the corpus holds after the call (0 after a reset). */
  readonly documentCount: number;
}

/**
 * An open binding: one owner's live corpus for one source, in one tenant and session. Pass it in
 * `groundTurn({ bindings: [binding] })`. `await using` closes it at the end of the block.
 */
export interface ChatBinding extends TurnBindingInit, AsyncDisposable {
  readonly bindingId: string;
  readonly ownerId: string;
  readonly source: string;
  /** Most hits a search gives (5 when opened without one); undefined for an attached handle that did not say. */
  readonly topK: number | undefined;
  /** Whether it serves a declared SEARCH entry; undefined for an attached handle that did not say. */
  readonly declared: boolean | undefined;
  readonly scope: Readonly<Required<ScopeInit>>;
  /** True once close() (or disposal) has closed it through this handle. */
  readonly closed: boolean;
  /** Adds documents (an existing id is replaced); searches see them once this resolves. */
  append(documents: readonly MemoryDocumentInit[], options?: CallOptions): Promise<AppendResult>;
  /** Makes the next search see the corpus as it now is; `{ reset: true }` empties it too. */
  invalidate(request?: { readonly reset?: boolean }, options?: CallOptions): Promise<InvalidateResult>;
  /**
   * Releases the binding. Idempotent: resolves true when this call closed it, false when it was not open
   * (already closed, or lost in a sidecar restart); a handle already closed answers false without a call.
   */
  close(options?: CallOptions): Promise<boolean>;
  /** close(), for `await using`. */
  [Symbol.asyncDispose](): Promise<void>;
  /**
   * What `attachBinding` needs to use this binding elsewhere (another process of the owner), its secret
   * handle included: hand it only to code that may act as the owner, and never log it.
   */
  reference(): BindingRefInit & Required<BindingShape>;
}

/**
 * ChatKnowledgeService: the grounding side of the host's sendToLLM(ChatTurn), plus the bindings' live
 * corpora. Every call takes `{ signal, timeoutMs }` and rejects with a typed RagSidecarError:
 * ValidationError (violations), PermissionDeniedError (a binding of another owner, tenant or session),
 * UnknownBindingError (a binding id that is not open), FailedPreconditionError (DIRECT budgets, window).
 */
export interface ChatClient {
  /**
   * Builds the outbound conversation of one turn; the input is never changed. The sidecar checks the turn (a
   * chatTurn() or a plain input alike) and a malformed one rejects with its ValidationError and violations.
   */
  groundTurn(request: GroundTurnInput, options?: CallOptions): Promise<GroundTurnResult>;
  /** Opens a binding with an empty corpus and returns its handle. */
  openBinding(request: OpenBindingInput, options?: CallOptions): Promise<ChatBinding>;
  /**
   * A handle for a binding opened earlier (no call is made; the id, and the binding against its owner's
   * declarations, are checked by the sidecar when used).
   */
  attachBinding(ref: BindingRefInit & BindingShape): ChatBinding;
  appendToBinding(request: AppendToBindingInput, options?: CallOptions): Promise<AppendResult>;
  invalidateBinding(request: InvalidateBindingInput, options?: CallOptions): Promise<InvalidateResult>;
  /** Idempotent: `{ wasOpen: false }` for an id that is not open. */
  closeBinding(request: CloseBindingInput, options?: CallOptions): Promise<{ readonly wasOpen: boolean }>;
}

// ---------------------------------------------------------------------------------------------------------
// Conversions

function toMessage(message: ChatMessageInit) {
  return {
    role: message.role,
    ...(message.content !== undefined && message.content !== null ? { content: message.content } : {}),
    name: message.name ?? "",
    toolCallId: message.toolCallId ?? "",
    ...(message.extra !== undefined ? { extra: structuredClone(message.extra) as JsonObject } : {}),
  };
}

function fromMessage(message: ChatMessageMessage): ChatMessage {
  return {
    role: message.role,
    content: message.content ?? null,
    ...(message.name ? { name: message.name } : {}),
    ...(message.toolCallId ? { toolCallId: message.toolCallId } : {}),
    ...(message.extra !== undefined ? { extra: message.extra } : {}),
  };
}

function toContext(context: ChatRetrievalContextInit) {
  const { deadline } = context;
  return {
    scope: { tenant: context.scope.tenant, session: context.scope.session ?? "" },
    runId: context.runId ?? "",
    agentName: context.agentName ?? "",
    simulationState: context.simulationState ?? "",
    episode: context.episode ?? "",
    sourceRevision: context.sourceRevision ?? "",
    ...(deadline === undefined
      ? {}
      : { deadline: deadline instanceof Date ? timestampFromDate(deadline) : timestampFromMs(deadline) }),
  };
}

function toActivity(record: ActivityRecordInit) {
  return {
    entries: (record.entries ?? []).map((entry) => ({
      tick: BigInt(entry.tick),
      kind: enumValue<ActivityKind>(ActivityKind, entry.kind, "activity kind") ?? ActivityKind.UNSPECIFIED,
      peer: entry.peer ?? "",
      type: entry.type ?? "",
      text: entry.text ?? "",
      failed: entry.failed ?? false,
    })),
    ...(record.maxEntries !== undefined ? { maxEntries: record.maxEntries } : {}),
    ...(record.maxTotalChars !== undefined ? { maxTotalChars: record.maxTotalChars } : {}),
    ...(record.maxEntryChars !== undefined ? { maxEntryChars: record.maxEntryChars } : {}),
    redactionRoots: (record.redactionRoots ?? []).map((r) => ({ path: r.path, replacement: r.replacement })),
  };
}

function fromOutcome(outcome: OwnerOutcomeMessage): OwnerOutcome {
  return {
    ownerId: outcome.ownerId,
    search: enumName(OwnerSearch, outcome.search) as OwnerSearchName,
    documentCount: outcome.documentCount,
    failOpenReason:
      outcome.failOpenReason === FailOpenReason.UNSPECIFIED
        ? undefined
        : (enumName(FailOpenReason, outcome.failOpenReason) as FailOpenReasonName),
    detail: outcome.detail,
    searchedSources: [...outcome.searchedSources],
    directBlocks: outcome.directBlocks.map((b) => ({
      source: b.source,
      position: b.position,
      text: b.text,
      tokens: b.tokens,
      budgetTokens: b.budgetTokens,
      sharedBudget: b.sharedBudget,
      documentCount: b.documentCount,
    })),
  };
}

function toRef(ref: BindingRefInit) {
  return { ...toCaller(ref), bindingId: ref.bindingId, ownerId: ref.ownerId, bindingHandle: ref.bindingHandle };
}

function toDocuments(documents: readonly MemoryDocumentInit[]) {
  return documents.map((d) => ({ id: d.id, text: d.text, metadata: { ...(d.metadata ?? {}) } }));
}

class Binding implements ChatBinding {
  readonly bindingId: string;
  readonly ownerId: string;
  readonly source: string;
  readonly topK: number | undefined;
  readonly declared: boolean | undefined;
  readonly scope: Readonly<Required<ScopeInit>>;
  readonly #principal: PrincipalInit;
  readonly #chat: ChatClient;
  /** The secret OpenBinding returned: presented on every call, never shown. */
  readonly #handle: string;
  /** The close in flight or done; cleared when it fails, so close() can be retried. */
  #closing: Promise<boolean> | undefined;
  #closed = false;

  constructor(chat: ChatClient, ref: BindingRefInit, shape: BindingShape) {
    this.#chat = chat;
    this.#principal = { id: ref.principal.id, roles: [...(ref.principal.roles ?? [])] };
    this.scope = Object.freeze({ tenant: ref.scope.tenant, session: ref.scope.session ?? "" });
    this.bindingId = ref.bindingId;
    this.ownerId = ref.ownerId;
    this.#handle = ref.bindingHandle;
    this.source = shape.source ?? "";
    this.topK = shape.topK;
    this.declared = shape.declared;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** The handle a turn binding presents: a ChatBinding's own, or the one a plain object carries. */
  static handleOf(binding: TurnBindingInit): string {
    return binding instanceof Binding ? binding.#handle : (binding.bindingHandle ?? "");
  }

  #ref(): BindingRefInit {
    return {
      principal: this.#principal,
      scope: this.scope,
      bindingId: this.bindingId,
      ownerId: this.ownerId,
      bindingHandle: this.#handle,
    };
  }

  append(documents: readonly MemoryDocumentInit[], options: CallOptions = {}): Promise<AppendResult> {
    return this.#chat.appendToBinding({ ...this.#ref(), documents }, options);
  }

  invalidate(request: { readonly reset?: boolean } = {}, options: CallOptions = {}): Promise<InvalidateResult> {
    return this.#chat.invalidateBinding({ ...this.#ref(), reset: request.reset ?? false }, options);
  }

  close(options: CallOptions = {}): Promise<boolean> {
    if (this.#closed) return Promise.resolve(false);
    this.#closing ??= this.#chat.closeBinding(this.#ref(), options).then(
      ({ wasOpen }) => {
        this.#closed = true;
        return wasOpen;
      },
      (error: unknown) => {
        this.#closing = undefined;
        throw error;
      },
    );
    return this.#closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  reference(): BindingRefInit & Required<BindingShape> {
    return { ...this.#ref(), source: this.source, topK: this.topK ?? CHAT_DEFAULT_TOP_K, declared: this.declared ?? true };
  }

  toJSON(): TurnBindingInit & { source: string } {
    return { bindingId: this.bindingId, ownerId: this.ownerId, source: this.source };
  }
}

export function chatClient(rpc: Client<typeof ChatKnowledgeService>): ChatClient {
  const chat: ChatClient = {
    async groundTurn(request, options = {}) {
      const message = {
        principal: { id: request.principal.id, roles: [...(request.principal.roles ?? [])] },
        conversation: request.conversation.map(toMessage),
        owners: (request.owners ?? []).map((owner) => ({
          ownerId: owner.ownerId,
          knowledge: (owner.knowledge ?? []).map(toEntry),
          stateText: owner.state ?? "",
        })),
        bindings: (request.bindings ?? []).map((b) => ({
          bindingId: b.bindingId,
          ownerId: b.ownerId,
          bindingHandle: Binding.handleOf(b),
        })),
        ...(request.context ? { context: toContext(request.context) } : {}),
        ...(request.scope ? { scope: { tenant: request.scope.tenant, session: request.scope.session ?? "" } } : {}),
        requestSection: request.requestSection ?? "",
        ...(request.activity ? { activity: toActivity(request.activity) } : {}),
        ...toLlm(request.llm),
      };
      const response = await callMapped(rpc.groundTurn, message, options);
      return {
        conversation: response.conversation.map(fromMessage),
        grounding: enumName(TurnGrounding, response.grounding) as TurnGroundingName,
        detail: response.detail,
        owners: response.owners.map(fromOutcome),
        staleFallbacks: response.staleFallbacks.map(fromStale),
        usage: toUsage(response.usage),
        timing: toTiming(response.timing),
      };
    },

    async openBinding(request, options = {}) {
      const message = {
        ...toCaller(request),
        ownerId: request.ownerId,
        source: request.source,
        ...(request.topK !== undefined ? { topK: request.topK } : {}),
        declared: request.declared ?? true,
      };
      const { bindingId, bindingHandle } = await callMapped(rpc.openBinding, message, options);
      return new Binding(chat, { ...request, bindingId, bindingHandle }, {
        source: request.source,
        topK: request.topK ?? CHAT_DEFAULT_TOP_K,
        declared: message.declared,
      });
    },

    attachBinding(ref) {
      return new Binding(chat, ref, ref);
    },

    async appendToBinding(request, options = {}) {
      const message = { ...toRef(request), documents: toDocuments(request.documents) };
      const response = await callMapped(rpc.appendToBinding, message, options);
      return { appended: response.appended, replaced: response.replaced, documentCount: response.documentCount };
    },

    async invalidateBinding(request, options = {}) {
      const message = { ...toRef(request), reset: request.reset ?? false };
      const response = await callMapped(rpc.invalidateBinding, message, options);
      return { documentCount: response.documentCount };
    },

    async closeBinding(request, options = {}) {
      const response = await callMapped(rpc.closeBinding, toRef(request), options);
      return { wasOpen: response.wasOpen };
    },
  };
  return chat;
}
