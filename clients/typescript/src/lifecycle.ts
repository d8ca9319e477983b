// defineSidecarRetrieval: the host-side bounded retrieval lifecycle (@jangts/agent-core defineRetrieval) over the
// RetrievalService client: prepare, assertInput, duplicate and budget checks, authorize, reserve, execute, receipt.
import { CancelledError } from "./errors.js";
import type { RagSidecarClient } from "./client.js";
import type { RetrievedChunk, SearchInput, SearchResult } from "./retrieval.js";

/** What a run is given besides the query: the host's application state and the run's AbortSignal. */
export interface OperationContext<App> {
  readonly app: App;
  readonly signal: AbortSignal;
}

/** A retrieved source; `sourceId` is replaced by the definition's sourceId() in the receipt. */
export interface RetrievalSource {
  readonly sourceId: string;
}

export interface RetrievalResult<Source extends RetrievalSource> {
  readonly sources: readonly Source[];
}

/** Request-owned state: the counters and sources of one conversation turn, task or request. */
export interface RetrievalState<Source extends RetrievalSource> {
  /** Successful queries so far; also the sequence of the latest receipt. */
  queryCount: number;
  /** Keys of every query that reached execute, successful or not. */
  readonly seen: Set<string>;
  /** Every source of every successful query, with its assigned sourceId, in order. */
  readonly sources: Source[];
}

/** The message (or the error) of a duplicate or budget rejection. */
export type RetrievalReason<Query, Context> = string | ((query: Query, context: Context) => string | Error);

export interface RetrievalReceipt<Query, Source extends RetrievalSource, Result extends RetrievalResult<Source>> {
  /** The runner's id. */
  readonly retrievalId: string;
  /** The prepared query. */
  readonly query: Query;
  /** Its deduplication key. */
  readonly key: string;
  /** The result, its sources carrying their assigned sourceId. */
  readonly result: Result;
  /** 1 for the state's first successful query, then 2, ... (the state's queryCount after this one). */
  readonly sequence: number;
  /** Clock (`now()`) when run() began and when the result was accepted. */
  readonly startedAt: number;
  readonly completedAt: number;
  /** Free slot for effects to annotate the receipt. */
  readonly extensions: Record<string, unknown>;
}

export interface RetrievalEffect<Query, Source extends RetrievalSource, Result extends RetrievalResult<Source>, Context> {
  readonly id: string;
  readonly description: string;
  handle(receipt: RetrievalReceipt<Query, Source, Result>, context: Context): void | Promise<void>;
}

/** A source of the sidecar's Search: one retrieved chunk. */
export interface SidecarSource extends RetrievalSource {
  /** The knowledge source's name. */
  readonly source: string;
  readonly text: string;
  /**
   * The score the hits are ranked by (`chunk.score`): the fused retrieval score, or when the entry reranks, by
   * default the fusion of the reranker's order with the retrieval order; the rerank relevance only with
   * `rerankOrder: "RERANKER"`. Undefined when not ranked.
   */
  readonly score: number | undefined;
  /** The reranker's relevance (0..1, `chunk.scores.rerank`) whatever the order; undefined when not reranked. */
  readonly relevance: number | undefined;
  readonly chunk: RetrievedChunk;
}

export interface SidecarSearchResult extends RetrievalResult<SidecarSource> {
  /** The whole Search result (hits, stale fallbacks, usage, timing). */
  readonly response: SearchResult;
}

/** The Search request of the default read: `client.retrieval.search`'s input. */
export type SearchRequestInit = SearchInput;

export interface SidecarRetrievalDefinition<Query, Source extends RetrievalSource, Result extends RetrievalResult<Source>, App> {
  readonly id: string;
  readonly description: string;
  readonly tags?: readonly string[];
  /** Normalizes the query before the assertions run. */
  readonly prepare?: (query: Query, context: OperationContext<App>) => Query | Promise<Query>;
  /** Rejects a malformed query by throwing. Nothing is counted or reserved. */
  readonly assertInput: (query: Query, context: OperationContext<App>) => void | Promise<void>;
  /** The request-owned state holding counters, the seen set and sources. */
  readonly state: (context: OperationContext<App>) => RetrievalState<Source>;
  /** Most accepted queries for the current state (successful ones plus those in flight). */
  readonly limit: (context: OperationContext<App>) => number;
  /** Deduplication key; defaults to a canonical serialization of the query. */
  readonly key?: (query: Query) => string;
  readonly errors?: {
    readonly duplicate?: RetrievalReason<Query, OperationContext<App>>;
    readonly budget?: RetrievalReason<Query, OperationContext<App>>;
  };
  /** Resource authorization: after the duplicate and budget checks, before the key is reserved. */
  readonly authorize?: (query: Query, context: OperationContext<App>) => void | Promise<void>;
  /**
   * The read (the lifecycle's execute step). Throwing does not refund the key. When omitted, the read is
   * the sidecar's RetrievalService.Search on `client` with `request(query)`, mapped to SidecarSearchResult.
   */
  readonly search?: (query: Query, context: OperationContext<App>) => Result | Promise<Result>;
  readonly client?: RagSidecarClient;
  /** Builds the Search request of a query (default read only). */
  readonly request?: (query: Query, context: OperationContext<App>) => SearchRequestInit;
  /** Validates the result; a throw leaves the query seen but not successful (not counted). */
  readonly assertResult?: (result: Result, query: Query, context: OperationContext<App>) => void | Promise<void>;
  /** Names a source; the value replaces sourceId in the receipt's result and in state.sources. */
  readonly sourceId?: (source: Source, query: Query, sequence: number, context: OperationContext<App>) => string;
  /** Run in order after every accepted (successful) query, with its receipt. */
  readonly effects?: readonly RetrievalEffect<Query, Source, Result, OperationContext<App>>[];
  /** Clock for receipt timestamps; defaults to Date.now. */
  readonly now?: () => number;
}

export interface SidecarRetrievalRunner<Query, Source extends RetrievalSource, Result extends RetrievalResult<Source>, App> {
  readonly id: string;
  readonly description: string;
  readonly tags: readonly string[];
  /** Effects that run after every accepted query. */
  readonly effects: readonly RetrievalEffect<Query, Source, Result, OperationContext<App>>[];
  /** Runs one query through the fixed lifecycle and resolves with its receipt. */
  run(input: Query, context: OperationContext<App>): Promise<RetrievalReceipt<Query, Source, Result>>;
}

/** A query refused by the duplicate or budget check; nothing was reserved or read. */
export class RetrievalRejectedError extends Error {
  constructor(
    message: string,
    readonly kind: "duplicate" | "budget",
    readonly retrievalId: string,
    readonly key: string,
  ) {
    super(message);
    this.name = new.target.name;
  }
}
/** The query's key is already in the state's seen set (including queries that failed after reserving it). */
export class RetrievalDuplicateError extends RetrievalRejectedError {}
/** The state's budget (limit) is spent. */
export class RetrievalBudgetError extends RetrievalRejectedError {}

/** Queries reserved but not finished yet, per state object: they count against the budget. */
const pending = new WeakMap<object, number>();

/**
 * Compiles an async retrieval runner whose read is the sidecar's Search (or an injected `search`).
 *
 * Lifecycle of run(input, context), in this fixed order:
 * prepare -> assertInput -> duplicate check -> budget check -> authorize -> reserve key (seen.add) ->
 * execute (search) -> assertResult -> count (queryCount += 1, sequence) -> sourceId -> receipt -> effects.
 *
 * Rejected queries stay in the caller's seen set once their key is reserved, so a retry is reported as a
 * duplicate; a throwing execute does not refund the key; only successful results increment the query count;
 * effects run after every accepted query.
 */
export function defineSidecarRetrieval<Query, App = unknown>(
  definition: SidecarRetrievalDefinition<Query, SidecarSource, SidecarSearchResult, App> & {
    readonly client: RagSidecarClient;
    readonly request: (query: Query, context: OperationContext<App>) => SearchRequestInit;
  },
): SidecarRetrievalRunner<Query, SidecarSource, SidecarSearchResult, App>;
export function defineSidecarRetrieval<Query, Source extends RetrievalSource, Result extends RetrievalResult<Source>, App = unknown>(
  definition: SidecarRetrievalDefinition<Query, Source, Result, App> & {
    readonly search: (query: Query, context: OperationContext<App>) => Result | Promise<Result>;
  },
): SidecarRetrievalRunner<Query, Source, Result, App>;
export function defineSidecarRetrieval<Query, Source extends RetrievalSource, Result extends RetrievalResult<Source>, App>(
  definition: SidecarRetrievalDefinition<Query, Source, Result, App>,
): SidecarRetrievalRunner<Query, Source, Result, App> {
  type Context = OperationContext<App>;
  const execute = definition.search ?? defaultSearch(definition);
  const keyOf = definition.key ?? canonicalKey;
  const now = definition.now ?? Date.now;
  const effects = Object.freeze([...(definition.effects ?? [])]);
  const id = definition.id;

  const reject = (
    kind: "duplicate" | "budget",
    reason: RetrievalReason<Query, Context> | undefined,
    query: Query,
    key: string,
    context: Context,
    fallback: string,
  ): never => {
    const made = typeof reason === "function" ? reason(query, context) : reason;
    if (made instanceof Error) throw made;
    const ErrorClass = kind === "duplicate" ? RetrievalDuplicateError : RetrievalBudgetError;
    throw new ErrorClass(made ?? fallback, kind, id, key);
  };

  const check = (state: RetrievalState<Source>, query: Query, key: string, context: Context): void => {
    if (state.seen.has(key)) {
      reject("duplicate", definition.errors?.duplicate, query, key, context, `${id}: query already run (key ${key})`);
    }
    const limit = definition.limit(context);
    if (state.queryCount + (pending.get(state) ?? 0) >= limit) {
      reject("budget", definition.errors?.budget, query, key, context, `${id}: retrieval budget of ${limit} queries spent`);
    }
  };

  const throwIfAborted = (context: Context): void => {
    if (context.signal.aborted) {
      throw new CancelledError(`${id}: retrieval cancelled`, { code: "CANCELLED", cause: context.signal.reason });
    }
  };

  return {
    id,
    description: definition.description,
    tags: Object.freeze([...(definition.tags ?? [])]),
    effects,
    async run(input, context) {
      const startedAt = now();
      const query = definition.prepare ? await definition.prepare(input, context) : input;
      await definition.assertInput(query, context);
      const state = definition.state(context);
      const key = keyOf(query);
      check(state, query, key, context);
      if (definition.authorize) {
        await definition.authorize(query, context);
        // authorize may await: a concurrent run may have reserved the key or the last budget slot meanwhile.
        check(state, query, key, context);
      }
      throwIfAborted(context);
      state.seen.add(key);
      pending.set(state, (pending.get(state) ?? 0) + 1);
      let result: Result;
      try {
        result = await execute(query, context);
        if (definition.assertResult) await definition.assertResult(result, query, context);
      } finally {
        pending.set(state, (pending.get(state) ?? 1) - 1);
      }
      state.queryCount += 1;
      const sequence = state.queryCount;
      const sources = result.sources.map((source) =>
        definition.sourceId ? { ...source, sourceId: definition.sourceId(source, query, sequence, context) } : source,
      );
      state.sources.push(...sources);
      const receipt: RetrievalReceipt<Query, Source, Result> = {
        retrievalId: id,
        query,
        key,
        result: { ...result, sources },
        sequence,
        startedAt,
        completedAt: now(),
        extensions: {},
      };
      for (const effect of effects) {
        await effect.handle(receipt, context);
      }
      return receipt;
    },
  };
}

function defaultSearch<Query, Source extends RetrievalSource, Result extends RetrievalResult<Source>, App>(
  definition: SidecarRetrievalDefinition<Query, Source, Result, App>,
): (query: Query, context: OperationContext<App>) => Promise<Result> {
  const { client, request } = definition;
  if (!client || !request) {
    throw new TypeError(`retrieval ${definition.id}: give either search, or client and request`);
  }
  return async (query, context) => {
    const response = await client.retrieval.search(request(query, context), { signal: context.signal });
    const sources: SidecarSource[] = response.hits.map((chunk) => ({
      sourceId: chunk.chunkId,
      source: chunk.source,
      text: chunk.text,
      score: chunk.score,
      relevance: chunk.scores?.rerank,
      chunk,
    }));
    return { sources, response } as unknown as Result;
  };
}

/** A stable serialization: object keys sorted, undefined members dropped, bigints as strings. */
export function canonicalKey(value: unknown): string {
  return JSON.stringify(canonical(value)) ?? "undefined";
}

function canonical(value: unknown): unknown {
  if (typeof value === "bigint") return `${value}n`;
  if (Array.isArray(value)) return value.map(canonical);
  if (value instanceof Date) return value.toISOString();
  if (value instanceof Set) return { $set: [...value].map((v) => JSON.stringify(canonical(v))).sort() };
  if (value instanceof Map) return { $map: [...value.entries()].map(([k, v]) => [canonical(k), canonical(v)]) };
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      const member = (value as Record<string, unknown>)[key];
      if (member !== undefined) out[key] = canonical(member);
    }
    return out;
  }
  return value;
}
