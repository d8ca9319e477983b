// The RetrievalService facade: plain typed objects in, plain typed objects out, typed errors.
import { fromJson, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate, ValueSchema } from "@bufbuild/protobuf/wkt";
import type { Client } from "@connectrpc/connect";
import { ErrorReason } from "./gen/ragsidecar/v1/common_pb.js";
import {
  KnowledgeOnFailure,
  KnowledgeReadiness,
  KnowledgeType,
  KnowledgeUse,
  RerankOrder,
  RetrievalMode,
  RetrievalService,
  type ContextBlock as ContextBlockMessage,
  type KnowledgeEntrySchema,
  type RetrievedChunk as RetrievedChunkMessage,
  type SourceCount as SourceCountMessage,
  type StaleFallback as StaleFallbackMessage,
  type TargetSchema,
} from "./gen/ragsidecar/v1/retrieval_pb.js";
import { callMapped, type CallOptions } from "./call.js";
import { fromMetadataValues, fromStoredDocument, toFilter, toMetadataValues, type Filter, type MetadataValue, type StoredDocument } from "./memory.js";
import { toTiming, toUsage, type RerankTiming, type RerankUsage } from "./reranker.js";

// ---------------------------------------------------------------------------------------------------------
// Declarations (request side)

/** Where a knowledge source's content comes from. */
export type KnowledgeTypeName = "FILE" | "DIRECTORY" | "MEMORY" | "INLINE";
/** How an action or chat turn consumes a source. */
export type KnowledgeUseName = "DIRECT" | "SEARCH" | "SEQUENTIAL";
/** When a source must hold content; unset means MUST_LOAD. */
export type KnowledgeReadinessName = "MUST_LOAD" | "WHEN_CONFIGURED";
/** What a dispatch does when the source fails; unset means FAIL. */
export type KnowledgeOnFailureName = "FAIL" | "CONTINUE";
/**
 * The order of a reranked SEARCH entry's hits. FUSED (the default, measured best): the reranker's order fused
 * with the retrieval order, so a hit in the reranker's top k can be pushed out. RERANKER: the reranker's own
 * relevance order cut to topK, as the host's Reranker SPI gives it.
 */
export type RerankOrderName = "FUSED" | "RERANKER";
/**
 * Which lists a SEARCH source's retrieval ranks by; unset means HYBRID. HYBRID: dense and BM25 fused as the
 * sidecar's `[retrieval] fusion` says. DENSE: the dense list alone (no hit has `scores.bm25`). LEXICAL: the
 * BM25 list alone (only chunks holding a query term are found; `scores.dense` still holds each hit's cosine).
 */
export type RetrievalModeName = "HYBRID" | "DENSE" | "LEXICAL";

/** The caller of a RetrievalService RPC. An empty id is refused with PermissionDeniedError. */
export interface PrincipalInit {
  readonly id: string;
  readonly roles?: readonly string[];
}

/** The partition a call reads and writes. An empty tenant is refused with ValidationError. */
export interface ScopeInit {
  readonly tenant: string;
  /** Empty or unset: tenant-wide (its own partition, not visible to session-scoped reads). */
  readonly session?: string;
}

/** How a SEARCH source is searched. */
export interface SearchOptionsInit {
  readonly rerank?: boolean;
  /** Reranker model id; unset means the configured default reranker. */
  readonly rerankerModel?: string;
  /** Fused candidates reranked; at least the entry's topK. Superseded by rerankDepth (not both). */
  readonly candidates?: number;
  /** The order of the reranked hits (and what their `score` is); unset means FUSED. */
  readonly rerankOrder?: RerankOrderName | RerankOrder;
  /**
   * Hits (documents when groupByDocument) reranked, independently of topK: the reranked head, then the rest in
   * retrieval order, cut to topK. Below topK it needs rerankOrder FUSED. Unset: candidates, as before.
   */
  readonly rerankDepth?: number;
  /** One hit per document (its best chunk), and topK counts documents. */
  readonly groupByDocument?: boolean;
  /** Which lists the retrieval ranks by; unset means HYBRID. */
  readonly retrievalMode?: RetrievalModeName | RetrievalMode;
}

/** One knowledge declaration (the host's @Knowledge). Enums take their short name or the generated enum. */
export interface KnowledgeEntryInit {
  readonly name: string;
  readonly type: KnowledgeTypeName | KnowledgeType;
  readonly use: KnowledgeUseName | KnowledgeUse;
  /** FILE: a file; DIRECTORY: a folder or glob; relative to the sidecar's first knowledge root. */
  readonly path?: string;
  /** The text of an INLINE entry. */
  readonly inlineText?: string;
  readonly topK?: number;
  readonly minScore?: number;
  readonly maxTokens?: number;
  readonly readiness?: KnowledgeReadinessName | KnowledgeReadiness;
  readonly enabled?: boolean;
  readonly onFailure?: KnowledgeOnFailureName | KnowledgeOnFailure;
  readonly search?: SearchOptionsInit;
}

/** One action of a target (the host's @ActionSpec). */
export interface ActionInit {
  readonly name: string;
  /** Knowledge names the action uses, in order. */
  readonly knowledge?: readonly string[];
  /** The parameter whose string value is the query; unset means the first string parameter. */
  readonly queryParameter?: string;
}

/** A Role or plain class that hosts actions and declares knowledge. */
export interface TargetInit {
  readonly name: string;
  readonly knowledge?: readonly KnowledgeEntryInit[];
  readonly actions?: readonly ActionInit[];
}

/** The model the knowledge is sized for; unset inputWindowTokens means the sidecar's model-window table. */
export interface LlmInit {
  readonly model?: string;
  readonly inputWindowTokens?: number;
}

/**
 * An action's working parameters, in declaration order: an object (`{ question: "...", limit: 3 }`, in
 * property order, which JavaScript keeps except for integer-like names) or an explicit list.
 */
export type ParamsInit = Readonly<Record<string, JsonValue>> | readonly { readonly name: string; readonly value: JsonValue }[];

/** Fields every RetrievalService request carries. */
export interface CallerInit {
  readonly principal: PrincipalInit;
  readonly scope: ScopeInit;
}

/** Fields of every request that resolves a target's knowledge. */
export interface TargetRequestInit extends CallerInit {
  readonly target: TargetInit;
  /** Knowledge in reach beyond the target's own; replaces a target entry of the same name. */
  readonly outer?: readonly KnowledgeEntryInit[];
  /** Per-call locations of FILE and DIRECTORY entries in reach, by name (host input only). */
  readonly resolvedPaths?: Readonly<Record<string, string>>;
}

export interface ValidateConfigurationInput extends CallerInit {
  readonly target: TargetInit;
  readonly outer?: readonly KnowledgeEntryInit[];
  readonly llm?: LlmInit;
  /** Knowledge names by action name, replacing what each listed action declares. */
  readonly actionKnowledge?: Readonly<Record<string, readonly string[]>>;
  /** The host resolves FILE paths per run: a FILE entry without a path is not a violation. */
  readonly pathsPerRun?: boolean;
  /**
   * Check the declarations only (the SPI's one-argument validateConfiguration): no source is read or measured,
   * so no model is needed. Otherwise DIRECT sources are measured against the llm's input window.
   */
  readonly declarationsOnly?: boolean;
}

export interface EnforceInput extends TargetRequestInit {
  /** The action being dispatched; one of target.actions. */
  readonly action: string;
  readonly params?: ParamsInit;
  readonly llm?: LlmInit;
  /** Knowledge names this action sees instead of the ones it declares. */
  readonly actionKnowledge?: readonly string[];
  /** Most tokens the whole context may take; unset means the sidecar's configured window. */
  readonly maxContextTokens?: number;
}

export interface RequireLoadedInput extends TargetRequestInit {
  /** Enabled SEARCH entries in reach to load; at least one. */
  readonly names: readonly string[];
}

export type RequireReadyInput = TargetRequestInit;

export interface PrepareChatKnowledgeInput extends CallerInit {
  readonly agentId: string;
  /** The agent's chat knowledge in declaration order (SEARCH entries keep the blocks' places). */
  readonly entries: readonly KnowledgeEntryInit[];
  readonly llm?: LlmInit;
}

export interface SearchInput extends TargetRequestInit {
  readonly query: string;
  /** Entries to search, whatever their use; unset or empty means every enabled SEARCH entry in reach. */
  readonly knowledge?: readonly string[];
  readonly topK?: number;
  readonly minScore?: number;
  /** Replaces each entry's search options. */
  readonly search?: SearchOptionsInit;
  /** Filters by knowledge name: only chunks whose document the filter keeps are searched (each name searched). */
  readonly filters?: Readonly<Record<string, Filter>>;
}

export interface MemoryDocumentInit {
  readonly id: string;
  readonly text: string;
  /** String metadata; filters see each entry as a string. A key may not also be in typedMetadata. */
  readonly metadata?: Readonly<Record<string, string>>;
  /** Typed metadata: strings, numbers, booleans, Dates and string lists, filterable with their types. */
  readonly typedMetadata?: Readonly<Record<string, MetadataValue>>;
  /** When the document expires: from then on no read sees it, and the sidecar purges it. */
  readonly expiresAt?: Date;
}

export interface UpsertDocumentsInput extends CallerInit {
  /** The MEMORY source's name. */
  readonly knowledge: string;
  readonly documents: readonly MemoryDocumentInit[];
}

export interface DeleteDocumentsInput extends CallerInit {
  readonly knowledge: string;
  /** The ids to delete; at least one unless `filter` is given (not both). */
  readonly ids?: readonly string[];
  /** Deletes every document the filter keeps (expired ones included); `filters.everything()` deletes them all. */
  readonly filter?: Filter;
}

export interface GetDocumentsInput extends CallerInit {
  readonly knowledge: string;
  /** 1 to 1,000 ids. */
  readonly ids: readonly string[];
}

export interface ListDocumentsInput extends CallerInit {
  readonly knowledge: string;
  /** Only the documents it keeps; unset lists every document. */
  readonly filter?: Filter;
  /** Most documents per page: unset or 0 means 100, at most 1,000. */
  readonly pageSize?: number;
  /** The previous page's nextPageToken (same knowledge and filter); unset for the first page. */
  readonly pageToken?: string;
}

export interface GetDocumentsResult {
  /** The documents found, in the order their ids were first asked for. */
  readonly documents: readonly StoredDocument[];
  /** Ids asked for that are absent or expired, in the order asked. */
  readonly notFound: readonly string[];
}

/** A document `searchDocuments` found. */
export interface ScoredDocument {
  readonly document: StoredDocument;
  /** The cosine similarity (-1..1) of the query and the document's best chunk. */
  readonly similarity: number;
}

export interface ListDocumentsResult {
  /** The page's documents, in the byte order of their UTF-8 ids. */
  readonly documents: readonly StoredDocument[];
  /** The next page's token; "" when this page is the last. */
  readonly nextPageToken: string;
}

// ---------------------------------------------------------------------------------------------------------
// Results (response side)

/** Embedding and rerank work a call spent (the same figures as a rerank's). */
export type RetrievalUsage = RerankUsage;
/** Server-side timings in microseconds. */
export type RetrievalTiming = RerankTiming;

/** One configuration problem; `reason` is the ErrorReason name, e.g. "DIRECT_BUDGET_EXCEEDED". */
export interface ConfigurationViolation {
  /** Request field path, e.g. "target.knowledge[2].max_tokens". */
  readonly field: string;
  readonly reason: string;
  readonly description: string;
}

export interface ValidationResult {
  /** True exactly when violations is empty. */
  readonly valid: boolean;
  /** Every problem found, all at once, in request field order. */
  readonly violations: readonly ConfigurationViolation[];
}

export interface Provenance {
  readonly source: string;
  /** Path relative to the knowledge root holding it; "" for INLINE and MEMORY. */
  readonly file: string;
  /** MEMORY document id or record key; "" otherwise. */
  readonly documentId: string;
  readonly lineStart: number | undefined;
  readonly lineEnd: number | undefined;
  readonly page: number | undefined;
  readonly charStart: number;
  readonly charEnd: number;
}

export interface HitScores {
  readonly dense: number;
  readonly bm25: number | undefined;
  readonly fused: number;
  readonly rerank: number | undefined;
}

export interface RetrievedChunk {
  readonly chunkId: string;
  readonly source: string;
  readonly text: string;
  readonly provenance: Provenance;
  /**
   * The score hits are ranked by: the fused score (the dense and BM25 lists fused as the sidecar's `[retrieval]
   * fusion` says); when the entry reranks, by default (rerankOrder FUSED) the reranker's relevance combined
   * with that retrieval score (`[retrieval] rerank_fusion`), and with rerankOrder RERANKER the rerank relevance
   * (0..1) itself. The reranker's own relevance is always `scores.rerank`. Undefined for DIRECT and SEQUENTIAL
   * text.
   */
  readonly score: number | undefined;
  /** Pipeline scores; undefined for DIRECT and SEQUENTIAL text. */
  readonly scores: HitScores | undefined;
  /** The metadata of the hit's MEMORY or chat-binding document (typed, and string metadata as strings); {} otherwise. */
  readonly metadata: Readonly<Record<string, MetadataValue>>;
}

export interface StaleFallback {
  readonly source: string;
  readonly reason: string;
  readonly lastGoodBuiltAt: Date | undefined;
}

export interface ContextBlock {
  readonly source: string;
  readonly use: KnowledgeUseName | "UNSPECIFIED";
  readonly chunks: readonly RetrievedChunk[];
  readonly tokens: number;
  readonly truncated: boolean;
}

/** Enforce's result: the seed's context keys as typed fields, plus the blocks and the query used. */
export interface EnforceResult {
  /** RETRIEVED_CONTEXT_KEY: the formatted context; "" when nothing was retrieved. */
  readonly retrievedContext: string;
  /** RETRIEVED_DOCUMENT_COUNT_KEY. */
  readonly documentCount: number;
  /** RETRIEVED_STALE_FALLBACK_KEY. */
  readonly staleFallbacks: readonly StaleFallback[];
  /** RETRIEVED_CONTEXT_TRUNCATED_KEY. */
  readonly truncated: boolean;
  readonly blocks: readonly ContextBlock[];
  /** The query SEARCH entries ran with; "" when blank or unpickable. */
  readonly query: string;
  readonly usage: RetrievalUsage;
  readonly timing: RetrievalTiming;
}

/** A source's unit count. */
export interface SourceCount {
  readonly name: string;
  readonly count: number;
}

export interface DirectKnowledgeBlock {
  readonly source: string;
  /** Index of the entry in the request's entries. */
  readonly position: number;
  readonly text: string;
  readonly tokens: number;
  readonly budgetTokens: number;
  readonly sharedBudget: boolean;
  readonly documentCount: number;
}

export interface ChatKnowledgePreparation {
  readonly blocks: readonly DirectKnowledgeBlock[];
  readonly inputWindowTokens: number;
  readonly defaultBudgetTokens: number;
  readonly defaultBudgetUsedTokens: number;
}

export interface SearchResult {
  /** Hits of every searched source, in descending score. */
  readonly hits: readonly RetrievedChunk[];
  readonly staleFallbacks: readonly StaleFallback[];
  readonly usage: RetrievalUsage;
  readonly timing: RetrievalTiming;
}

export interface UpsertResult {
  readonly inserted: number;
  readonly replaced: number;
  readonly unchanged: number;
  /** Documents the source holds in this scope after the call. */
  readonly documentCount: number;
}

export interface DeleteResult {
  readonly deleted: number;
  readonly notFound: number;
  readonly documentCount: number;
}

/**
 * RetrievalService: knowledge-context injection at action dispatch (the host's RetrievalSpi), Search, and
 * the write side of MEMORY knowledge. Every call takes `{ signal, timeoutMs }` and rejects with a typed
 * RagSidecarError (see the README's error table).
 */
export interface RetrievalClient {
  /** Every violation at once; configuration problems resolve with valid = false, never reject. */
  validateConfiguration(request: ValidateConfigurationInput, options?: CallOptions): Promise<ValidationResult>;
  enforce(request: EnforceInput, options?: CallOptions): Promise<EnforceResult>;
  /** Each named SEARCH source's document count, in sorted name order. */
  requireLoaded(request: RequireLoadedInput, options?: CallOptions): Promise<readonly SourceCount[]>;
  /** Each checked source's unit count, in sorted name order; KnowledgeNotReadyError when one is empty. */
  requireReady(request: RequireReadyInput, options?: CallOptions): Promise<readonly SourceCount[]>;
  prepareChatKnowledge(request: PrepareChatKnowledgeInput, options?: CallOptions): Promise<ChatKnowledgePreparation>;
  search(request: SearchInput, options?: CallOptions): Promise<SearchResult>;
  upsertDocuments(request: UpsertDocumentsInput, options?: CallOptions): Promise<UpsertResult>;
  deleteDocuments(request: DeleteDocumentsInput, options?: CallOptions): Promise<DeleteResult>;
  /** Reads MEMORY documents by id; absent and expired ones are in notFound. */
  getDocuments(request: GetDocumentsInput, options?: CallOptions): Promise<GetDocumentsResult>;
  /** One page of the MEMORY documents a filter keeps, by id. */
  listDocuments(request: ListDocumentsInput, options?: CallOptions): Promise<ListDocumentsResult>;
  /**
   * The MEMORY documents a search ranks, each once and whole: `search` of the one knowledge the request names (hits
   * grouped by document), then `getDocuments` of their ids (one deleted or expired in between is left out). Each
   * `similarity` is the cosine of the query and the document's best chunk (what `minScore` compares with when the
   * entry does not rerank).
   */
  searchDocuments(request: SearchInput, options?: CallOptions): Promise<readonly ScoredDocument[]>;
  /** Every MEMORY document a filter keeps, a page at a time as the iteration goes (each document present throughout once). */
  iterateDocuments(request: Omit<ListDocumentsInput, "pageToken">, options?: CallOptions): AsyncIterable<StoredDocument>;
}

// ---------------------------------------------------------------------------------------------------------
// Conversions

export function enumValue<E extends number>(
  enumObject: Record<string, string | number>,
  value: string | E | undefined,
  what: string,
): E | undefined {
  if (value === undefined) return undefined;
  if (typeof value === "number") return value;
  const found = enumObject[value];
  if (typeof found !== "number") throw new TypeError(`unknown ${what} ${JSON.stringify(value)}`);
  return found as E;
}

export function enumName(enumObject: Record<string | number, string | number>, value: number): string {
  const name = enumObject[value];
  return typeof name === "string" ? name : "UNSPECIFIED";
}

type EntryInitShape = MessageInitShape<typeof KnowledgeEntrySchema>;

export function toEntry(entry: KnowledgeEntryInit): EntryInitShape {
  return {
    name: entry.name,
    type: enumValue<KnowledgeType>(KnowledgeType, entry.type, "knowledge type") ?? KnowledgeType.UNSPECIFIED,
    use: enumValue<KnowledgeUse>(KnowledgeUse, entry.use, "knowledge use") ?? KnowledgeUse.UNSPECIFIED,
    path: entry.path ?? "",
    inlineText: entry.inlineText ?? "",
    ...(entry.topK !== undefined ? { topK: entry.topK } : {}),
    ...(entry.minScore !== undefined ? { minScore: entry.minScore } : {}),
    ...(entry.maxTokens !== undefined ? { maxTokens: entry.maxTokens } : {}),
    readiness: enumValue<KnowledgeReadiness>(KnowledgeReadiness, entry.readiness, "readiness") ?? KnowledgeReadiness.UNSPECIFIED,
    ...(entry.enabled !== undefined ? { enabled: entry.enabled } : {}),
    onFailure: enumValue<KnowledgeOnFailure>(KnowledgeOnFailure, entry.onFailure, "onFailure") ?? KnowledgeOnFailure.UNSPECIFIED,
    ...(entry.search ? { search: toSearchOptions(entry.search) } : {}),
  };
}

function toSearchOptions(options: SearchOptionsInit) {
  return {
    rerank: options.rerank ?? false,
    rerankerModel: options.rerankerModel ?? "",
    ...(options.candidates !== undefined ? { candidates: options.candidates } : {}),
    rerankOrder: enumValue<RerankOrder>(RerankOrder, options.rerankOrder, "rerank order") ?? RerankOrder.UNSPECIFIED,
    ...(options.rerankDepth !== undefined ? { rerankDepth: options.rerankDepth } : {}),
    groupByDocument: options.groupByDocument ?? false,
    retrievalMode: enumValue<RetrievalMode>(RetrievalMode, options.retrievalMode, "retrieval mode") ?? RetrievalMode.UNSPECIFIED,
  };
}

function toTarget(target: TargetInit): MessageInitShape<typeof TargetSchema> {
  return {
    name: target.name,
    knowledge: (target.knowledge ?? []).map(toEntry),
    actions: (target.actions ?? []).map((action) => ({
      name: action.name,
      knowledge: [...(action.knowledge ?? [])],
      ...(action.queryParameter !== undefined ? { queryParameter: action.queryParameter } : {}),
    })),
  };
}

export function toLlm(llm: LlmInit | undefined) {
  if (!llm) return {};
  return {
    llm: {
      model: llm.model ?? "",
      ...(llm.inputWindowTokens !== undefined ? { inputWindowTokens: llm.inputWindowTokens } : {}),
    },
  };
}

export function toCaller(request: CallerInit) {
  return {
    principal: { id: request.principal.id, roles: [...(request.principal.roles ?? [])] },
    scope: { tenant: request.scope.tenant, session: request.scope.session ?? "" },
  };
}

function toTargetRequest(request: TargetRequestInit) {
  return {
    ...toCaller(request),
    target: toTarget(request.target),
    outer: (request.outer ?? []).map(toEntry),
    resolvedPaths: { ...(request.resolvedPaths ?? {}) },
  };
}

function toParams(params: ParamsInit | undefined) {
  if (!params) return [];
  const list = Array.isArray(params)
    ? (params as readonly { readonly name: string; readonly value: JsonValue }[])
    : Object.entries(params as Readonly<Record<string, JsonValue>>).map(([name, value]) => ({ name, value }));
  return list.map(({ name, value }) => ({ name, value: fromJson(ValueSchema, value) }));
}

function fromChunk(chunk: RetrievedChunkMessage): RetrievedChunk {
  const p = chunk.provenance;
  return {
    chunkId: chunk.chunkId,
    source: chunk.source,
    text: chunk.text,
    provenance: {
      source: p?.source ?? chunk.source,
      file: p?.file ?? "",
      documentId: p?.documentId ?? "",
      lineStart: p?.lineStart,
      lineEnd: p?.lineEnd,
      page: p?.page,
      charStart: p?.charStart ?? 0,
      charEnd: p?.charEnd ?? 0,
    },
    score: chunk.score,
    scores: chunk.scores
      ? { dense: chunk.scores.dense, bm25: chunk.scores.bm25, fused: chunk.scores.fused, rerank: chunk.scores.rerank }
      : undefined,
    metadata: fromMetadataValues(chunk.metadata),
  };
}

export function fromStale(stale: StaleFallbackMessage): StaleFallback {
  return {
    source: stale.source,
    reason: stale.reason,
    lastGoodBuiltAt: stale.lastGoodBuiltAt ? timestampDate(stale.lastGoodBuiltAt) : undefined,
  };
}

function fromBlock(block: ContextBlockMessage): ContextBlock {
  return {
    source: block.source,
    use: enumName(KnowledgeUse, block.use) as ContextBlock["use"],
    chunks: block.chunks.map(fromChunk),
    tokens: block.tokens,
    truncated: block.truncated,
  };
}

function fromCounts(counts: readonly SourceCountMessage[]): SourceCount[] {
  return counts.map((c) => ({ name: c.name, count: c.count }));
}

async function listPage(rpc: Client<typeof RetrievalService>, request: ListDocumentsInput, options: CallOptions): Promise<ListDocumentsResult> {
  const message = {
    ...toCaller(request),
    knowledge: request.knowledge,
    pageSize: request.pageSize ?? 0,
    pageToken: request.pageToken ?? "",
    ...(request.filter ? { filter: toFilter(request.filter) } : {}),
  };
  const response = await callMapped(rpc.listDocuments, message, options);
  return { documents: response.documents.map(fromStoredDocument), nextPageToken: response.nextPageToken };
}

/** Sends a request built beforehand (a malformed init throws its TypeError, unwrapped); maps the failure. */
export function retrievalClient(rpc: Client<typeof RetrievalService>): RetrievalClient {
  const retrieval: RetrievalClient = {
    async validateConfiguration(request, options = {}) {
      const actionKnowledge: Record<string, { names: string[] }> = {};
      for (const [action, names] of Object.entries(request.actionKnowledge ?? {})) actionKnowledge[action] = { names: [...names] };
      const message = {
        ...toCaller(request),
        target: toTarget(request.target),
        outer: (request.outer ?? []).map(toEntry),
        ...toLlm(request.llm),
        actionKnowledge,
        pathsPerRun: request.pathsPerRun ?? false,
        declarationsOnly: request.declarationsOnly ?? false,
      };
      const response = await callMapped(rpc.validateConfiguration, message, options);
      return {
        valid: response.valid,
        violations: response.violations.map((v) => ({
          field: v.field,
          reason: enumName(ErrorReason, v.reason),
          description: v.description,
        })),
      };
    },

    async enforce(request, options = {}) {
      const message = {
        ...toTargetRequest(request),
        action: request.action,
        params: toParams(request.params),
        ...toLlm(request.llm),
        ...(request.actionKnowledge ? { actionKnowledge: { names: [...request.actionKnowledge] } } : {}),
        ...(request.maxContextTokens !== undefined ? { maxContextTokens: request.maxContextTokens } : {}),
      };
      const response = await callMapped(rpc.enforce, message, options);
      return {
        retrievedContext: response.retrievedContext,
        documentCount: response.documentCount,
        staleFallbacks: response.staleFallbacks.map(fromStale),
        truncated: response.truncated,
        blocks: response.blocks.map(fromBlock),
        query: response.query,
        usage: toUsage(response.usage),
        timing: toTiming(response.timing),
      };
    },

    async requireLoaded(request, options = {}) {
      const message = { ...toTargetRequest(request), names: [...request.names] };
      return fromCounts((await callMapped(rpc.requireLoaded, message, options)).counts);
    },

    async requireReady(request, options = {}) {
      return fromCounts((await callMapped(rpc.requireReady, toTargetRequest(request), options)).counts);
    },

    async prepareChatKnowledge(request, options = {}) {
      const message = { ...toCaller(request), agentId: request.agentId, entries: request.entries.map(toEntry), ...toLlm(request.llm) };
      const response = await callMapped(rpc.prepareChatKnowledge, message, options);
      return {
        blocks: response.blocks.map((b) => ({
          source: b.source,
          position: b.position,
          text: b.text,
          tokens: b.tokens,
          budgetTokens: b.budgetTokens,
          sharedBudget: b.sharedBudget,
          documentCount: b.documentCount,
        })),
        inputWindowTokens: response.inputWindowTokens,
        defaultBudgetTokens: response.defaultBudgetTokens,
        defaultBudgetUsedTokens: response.defaultBudgetUsedTokens,
      };
    },

    async search(request, options = {}) {
      const message = {
        ...toTargetRequest(request),
        query: request.query,
        knowledge: [...(request.knowledge ?? [])],
        ...(request.topK !== undefined ? { topK: request.topK } : {}),
        ...(request.minScore !== undefined ? { minScore: request.minScore } : {}),
        ...(request.search ? { search: toSearchOptions(request.search) } : {}),
        filters: Object.fromEntries(Object.entries(request.filters ?? {}).map(([name, f]) => [name, toFilter(f, `filters["${name}"]`)])),
      };
      const response = await callMapped(rpc.search, message, options);
      return {
        hits: response.hits.map(fromChunk),
        staleFallbacks: response.staleFallbacks.map(fromStale),
        usage: toUsage(response.usage),
        timing: toTiming(response.timing),
      };
    },

    async upsertDocuments(request, options = {}) {
      const message = {
        ...toCaller(request),
        knowledge: request.knowledge,
        documents: request.documents.map((d, i) => ({
          id: d.id,
          text: d.text,
          metadata: { ...(d.metadata ?? {}) },
          typedMetadata: toMetadataValues(d.typedMetadata ?? {}, `documents[${i}].typedMetadata`),
          ...(d.expiresAt ? { expiresAt: timestampFromDate(d.expiresAt) } : {}),
        })),
      };
      const response = await callMapped(rpc.upsertDocuments, message, options);
      return {
        inserted: response.inserted,
        replaced: response.replaced,
        unchanged: response.unchanged,
        documentCount: response.documentCount,
      };
    },

    async deleteDocuments(request, options = {}) {
      const message = {
        ...toCaller(request),
        knowledge: request.knowledge,
        ids: [...(request.ids ?? [])],
        ...(request.filter ? { filter: toFilter(request.filter) } : {}),
      };
      const response = await callMapped(rpc.deleteDocuments, message, options);
      return { deleted: response.deleted, notFound: response.notFound, documentCount: response.documentCount };
    },

    async getDocuments(request, options = {}) {
      const message = { ...toCaller(request), knowledge: request.knowledge, ids: [...request.ids] };
      const response = await callMapped(rpc.getDocuments, message, options);
      return { documents: response.documents.map(fromStoredDocument), notFound: [...response.notFound] };
    },

    listDocuments(request, options = {}) {
      return listPage(rpc, request, options);
    },

    async searchDocuments(request, options = {}) {
      const [knowledge, ...others] = request.knowledge ?? [];
      if (knowledge === undefined || others.length > 0) {
        throw new TypeError(`searchDocuments searches one MEMORY knowledge; the request names ${JSON.stringify(request.knowledge ?? [])}`);
      }
      const result = await retrieval.search({ ...request, search: { ...request.search, groupByDocument: true } }, options);
      const similarity = new Map<string, number>();
      for (const hit of result.hits) {
        if (!similarity.has(hit.provenance.documentId)) similarity.set(hit.provenance.documentId, hit.scores?.dense ?? 0);
      }
      if (similarity.size === 0) return [];
      const found = await retrieval.getDocuments({ principal: request.principal, scope: request.scope, knowledge, ids: [...similarity.keys()] }, options);
      const byId = new Map(found.documents.map((d) => [d.id, d]));
      return [...similarity].flatMap(([id, score]) => {
        const document = byId.get(id);
        return document ? [{ document, similarity: score }] : [];
      });
    },

    async *iterateDocuments(request, options = {}) {
      let pageToken = "";
      do {
        const page = await listPage(rpc, { ...request, pageToken }, options);
        yield* page.documents;
        pageToken = page.nextPageToken;
      } while (pageToken !== "");
    },
  };
  return retrieval;
}
