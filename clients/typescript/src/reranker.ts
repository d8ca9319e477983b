import { create } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import {
  LongDocumentStrategy,
  ModelKind,
  ModelState,
  RerankDocumentSchema,
  RerankRequestSchema,
  type RerankerService,
  type ListModelsResponse,
} from "./gen/ragsidecar/v1/reranker_pb.js";
import type { Timing, Usage } from "./gen/ragsidecar/v1/common_pb.js";
import { CancelledError, RagSidecarError, ValidationError, toRagSidecarError, type FieldViolation } from "./errors.js";
import { callOptions, raceWithOptions, type CallOptions } from "./call.js";

export type { CallOptions };

/** A candidate document; a bare string is a document with no id. */
export interface RerankDocument {
  readonly id?: string | undefined;
  readonly text: string;
  readonly metadata?: Readonly<Record<string, string>> | undefined;
}

/** A document as sent: id "" when it had none, metadata {} when it had none. */
export interface SentDocument {
  readonly id: string;
  readonly text: string;
  readonly metadata: Readonly<Record<string, string>>;
}

export type LongDocumentStrategyName = "truncate" | "window";

export interface RerankRequest {
  /** The original user query; must not be blank. */
  readonly query: string;
  /** Candidates; ids, when given, must be unique. */
  readonly documents: readonly (RerankDocument | string)[];
  /** Most results returned; unset returns every document. Sent to the server and enforced again locally. */
  readonly topN?: number | undefined;
  /** Model id (case-sensitive); unset means the sidecar's default reranker. */
  readonly model?: string | undefined;
  /** Return each result's document (text and metadata). */
  readonly returnDocuments?: boolean | undefined;
  /** Cap on each document's tokens, below the model's window. */
  readonly maxDocumentTokens?: number | undefined;
  /** What to do with documents longer than the window; unset uses the model's default. */
  readonly longDocumentStrategy?: LongDocumentStrategyName | undefined;
  /** Drop results whose relevance is below this threshold (0..1). */
  readonly minRelevanceScore?: number | undefined;
}

/** One ranked document. */
export interface RankedDocument {
  /** Position of the document in RerankRequest.documents. */
  readonly index: number;
  /** The document's id as sent ("" when it had none). */
  readonly id: string;
  /** Relevance in 0..1 (NaN from the no-op reranker: unscored). */
  readonly relevanceScore: number;
  /** Raw model output (logit for cross-encoders, cosine for bi-encoders; NaN from the no-op reranker). */
  readonly rawScore: number;
  /** Window that scored best when the document was windowed; 0 otherwise. */
  readonly bestWindow: number;
  /** The document as sent, when returnDocuments was set. */
  readonly document?: SentDocument;
}

export interface RerankUsage {
  readonly pairs: number;
  readonly tokens: number;
  readonly cachedPairs: number;
  readonly truncatedDocuments: number;
}

export interface RerankTiming {
  readonly tokenizationUs: number;
  readonly queueUs: number;
  readonly inferenceUs: number;
  readonly totalUs: number;
}

export interface RerankResponse {
  /** Results in descending relevance, at most topN of them. */
  readonly results: readonly RankedDocument[];
  /** The model that scored the request ("" for the no-op reranker). */
  readonly model: string;
  readonly usage: RerankUsage;
  readonly timing: RerankTiming;
}

export type ModelKindName = "cross-encoder" | "bi-encoder" | "unspecified";
export type ModelStateName = "loading" | "ready" | "failed" | "unspecified";

export interface ModelInfo {
  readonly id: string;
  readonly kind: ModelKindName;
  readonly maxInputTokens: number;
  readonly state: ModelStateName;
  /** Why the model failed to load; "" unless state is "failed". */
  readonly error: string;
  readonly isDefault: boolean;
  readonly longDocumentStrategy: LongDocumentStrategyName | "unspecified";
}

/** A ListModels answer, as cached by the reranker facade. */
export interface ModelSnapshot {
  readonly models: readonly ModelInfo[];
  /** Increases with every successful configuration reload of the sidecar. */
  readonly generation: number;
  readonly lastReloadError: string;
  /** When the snapshot was taken (Date.now()). */
  readonly fetchedAt: number;
}

/** The host's Reranker SPI, as the sidecar serves it. */
export interface Reranker {
  /**
   * Whether the sidecar serves exactly this model identifier (case-sensitive), answered synchronously from the
   * cached model list: true for a configured model that is ready or still loading, false for an unknown or
   * failed one, and false until the first snapshot arrived (`client.awaitReady()` waits for a current one). As in the host's Reranker SPI (and the Java
   * client), "" and undefined are not identifiers and answer false; `snapshot()` names the default model.
   */
  supports(model?: string): boolean;
  /** Resolves once the first model snapshot is cached; rejects if the sidecar refuses ListModels outright (auth). */
  ready(options?: CallOptions): Promise<void>;
  /** The cached snapshot, or undefined before the first one. */
  snapshot(): ModelSnapshot | undefined;
  /** Fetches a fresh snapshot now. */
  refresh(options?: CallOptions): Promise<ModelSnapshot>;
  /** Scores the documents against the query and returns them in relevance order. */
  rerank(request: RerankRequest, options?: CallOptions): Promise<RerankResponse>;
}

export interface SnapshotOptions {
  /** Interval of the background ListModels refresh; default 30 s. */
  readonly modelRefreshMs?: number | undefined;
}

const PERMANENT = new Set(["UNAUTHENTICATED", "PERMISSION_DENIED", "UNIMPLEMENTED"]);
/** Longest wait between two ListModels attempts while there is no snapshot yet. */
const MAX_RETRY_BEFORE_FIRST_SNAPSHOT_MS = 1_000;

/** The sidecar-backed reranker; the timer and in-flight refreshes stop with `stop()`. */
export class SidecarReranker implements Reranker {
  private current: ModelSnapshot | undefined;
  private readonly first: Promise<void>;
  private settleFirst!: (error?: unknown) => void;
  private firstSettled = false;
  private timer: NodeJS.Timeout | undefined;
  private failures = 0;
  private stopped = false;
  private readonly lifetime = new AbortController();
  private inflight: Promise<ModelSnapshot> | undefined;
  private readonly refreshMs: number;

  constructor(private readonly rpc: Client<typeof RerankerService>, options: SnapshotOptions = {}) {
    this.refreshMs = options.modelRefreshMs ?? 30_000;
    this.first = new Promise<void>((resolve, reject) => {
      this.settleFirst = (error?: unknown) => {
        if (this.firstSettled) return;
        this.firstSettled = true;
        if (error === undefined) resolve();
        else reject(error);
      };
    });
    // Callers that never await ready() must not see an unhandled rejection.
    this.first.catch(() => undefined);
    this.background();
  }

  supports(model?: string): boolean {
    const snapshot = this.current;
    if (!snapshot || !model) return false;
    const info = snapshot.models.find((m) => m.id === model);
    return info !== undefined && info.state !== "failed";
  }

  snapshot(): ModelSnapshot | undefined {
    return this.current;
  }

  ready(options: CallOptions = {}): Promise<void> {
    return raceWithOptions(this.first, options);
  }

  refresh(options: CallOptions = {}): Promise<ModelSnapshot> {
    if (!this.inflight) {
      const signal = this.lifetime.signal;
      this.inflight = this.rpc
        .listModels({}, { signal })
        .then((response) => {
          const snapshot = toSnapshot(response);
          this.current = snapshot;
          this.failures = 0;
          this.settleFirst();
          return snapshot;
        })
        .catch((error: unknown) => {
          const mapped = toRagSidecarError(error);
          if (PERMANENT.has(mapped.code)) this.settleFirst(mapped);
          throw mapped;
        })
        .finally(() => {
          this.inflight = undefined;
        });
      this.inflight.catch(() => undefined);
    }
    return raceWithOptions(this.inflight, options);
  }

  async rerank(request: RerankRequest, options: CallOptions = {}): Promise<RerankResponse> {
    const documents = request.documents.map(normalizeDocument);
    const message = create(RerankRequestSchema, {
      model: request.model ?? "",
      query: request.query,
      documents: documents.map((d) => create(RerankDocumentSchema, { id: d.id, text: d.text, metadata: { ...d.metadata } })),
      returnDocuments: request.returnDocuments ?? false,
      longDocumentStrategy: toStrategy(request.longDocumentStrategy),
      ...(request.topN !== undefined ? { topN: request.topN } : {}),
      ...(request.maxDocumentTokens !== undefined ? { maxDocumentTokens: request.maxDocumentTokens } : {}),
      ...(request.minRelevanceScore !== undefined ? { minRelevanceScore: request.minRelevanceScore } : {}),
    });
    let response;
    try {
      response = await this.rpc.rerank(message, callOptions(options));
    } catch (error) {
      const mapped = toRagSidecarError(error);
      if (mapped.reason === "UNKNOWN_MODEL" || mapped.reason === "MODEL_NOT_READY") {
        // The cached model list is stale: refresh it in the background.
        this.refresh().catch(() => undefined);
      }
      throw mapped;
    }
    const seen = new Set<number>();
    const results: RankedDocument[] = [];
    for (const result of response.results) {
      const sent = documents[result.index];
      if (sent === undefined || seen.has(result.index) || result.id !== sent.id) {
        throw new RagSidecarError(
          `reranker returned result ${JSON.stringify({ index: result.index, id: result.id })} that is not ` +
            `a document of the request or repeats one`,
          { code: "INTERNAL", reason: "INVALID_RESPONSE" },
        );
      }
      seen.add(result.index);
      const ranked: RankedDocument = {
        index: result.index,
        id: result.id,
        relevanceScore: result.relevanceScore,
        rawScore: result.rawScore,
        bestWindow: result.bestWindow,
        ...(request.returnDocuments
          ? {
              document: {
                id: result.document?.id ?? sent.id,
                text: result.document?.text ?? sent.text,
                metadata: { ...(result.document?.metadata ?? sent.metadata) },
              },
            }
          : {}),
      };
      results.push(ranked);
    }
    return {
      results: request.topN !== undefined ? results.slice(0, request.topN) : results,
      model: response.model,
      usage: toUsage(response.usage),
      timing: toTiming(response.timing),
    };
  }

  /** Stops the background refresh and cancels an in-flight one. */
  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.lifetime.abort();
    this.settleFirst(new CancelledError("client closed", { code: "CANCELLED" }));
  }

  private background(): void {
    if (this.stopped) return;
    this.refresh().then(
      () => this.schedule(this.refreshMs),
      (error: RagSidecarError) => {
        this.failures += 1;
        // Transient failures (the sidecar is starting) retry fast, at least every second until the first
        // snapshot (so a sidecar started after the host is noticed promptly); refusals retry at the normal pace.
        const cap = this.current === undefined ? Math.min(MAX_RETRY_BEFORE_FIRST_SNAPSHOT_MS, this.refreshMs) : this.refreshMs;
        const delay = PERMANENT.has(error.code) ? this.refreshMs : Math.min(250 * 2 ** Math.min(this.failures - 1, 8), cap);
        this.schedule(delay);
      },
    );
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => this.background(), delayMs);
    this.timer.unref();
  }
}

/**
 * A reranker that supports no model and keeps the request order, cut to topN: the host's fallback. Its
 * results are unscored: relevanceScore and rawScore are NaN (test with Number.isNaN), as in the Java client,
 * so that no threshold or comparison mistakes them for a relevance.
 */
export function noOpReranker(): Reranker {
  return {
    supports: () => false,
    ready: () => Promise.resolve(),
    snapshot: () => undefined,
    refresh: () => Promise.resolve({ models: [], generation: 0, lastReloadError: "", fetchedAt: Date.now() }),
    rerank: async (request, options = {}) => {
      if (options.signal?.aborted) {
        throw new CancelledError("operation cancelled", { code: "CANCELLED", cause: options.signal.reason });
      }
      const violations: FieldViolation[] = [];
      if (request.topN !== undefined && request.topN < 0) {
        violations.push({ field: "top_n", description: `must not be negative, got ${request.topN}` });
      }
      if (violations.length > 0) {
        throw new ValidationError("invalid rerank request", { code: "INVALID_ARGUMENT", reason: "INVALID_REQUEST", violations });
      }
      const documents = request.documents.map(normalizeDocument);
      const results: RankedDocument[] = documents.map((d, index) => ({
        index,
        id: d.id,
        relevanceScore: Number.NaN,
        rawScore: Number.NaN,
        bestWindow: 0,
        ...(request.returnDocuments ? { document: { id: d.id, text: d.text, metadata: { ...d.metadata } } } : {}),
      }));
      return {
        results: request.topN !== undefined ? results.slice(0, request.topN) : results,
        model: "",
        usage: { pairs: 0, tokens: 0, cachedPairs: 0, truncatedDocuments: 0 },
        timing: { tokenizationUs: 0, queueUs: 0, inferenceUs: 0, totalUs: 0 },
      };
    },
  };
}

function normalizeDocument(document: RerankDocument | string): SentDocument {
  if (typeof document === "string") return { id: "", text: document, metadata: {} };
  return { id: document.id ?? "", text: document.text, metadata: document.metadata ?? {} };
}

function toStrategy(name: LongDocumentStrategyName | undefined): LongDocumentStrategy {
  if (name === "truncate") return LongDocumentStrategy.TRUNCATE;
  if (name === "window") return LongDocumentStrategy.WINDOW;
  return LongDocumentStrategy.UNSPECIFIED;
}

function toSnapshot(response: ListModelsResponse): ModelSnapshot {
  return {
    models: response.models.map((m) => ({
      id: m.id,
      kind: m.kind === ModelKind.CROSS_ENCODER ? "cross-encoder" : m.kind === ModelKind.BI_ENCODER ? "bi-encoder" : "unspecified",
      maxInputTokens: m.maxInputTokens,
      state:
        m.state === ModelState.READY ? "ready" : m.state === ModelState.LOADING ? "loading" : m.state === ModelState.FAILED ? "failed" : "unspecified",
      error: m.error,
      isDefault: m.isDefault,
      longDocumentStrategy:
        m.longDocumentStrategy === LongDocumentStrategy.TRUNCATE
          ? "truncate"
          : m.longDocumentStrategy === LongDocumentStrategy.WINDOW
            ? "window"
            : "unspecified",
    })),
    generation: Number(response.generation),
    lastReloadError: response.lastReloadError,
    fetchedAt: Date.now(),
  };
}

export function toUsage(usage: Usage | undefined): RerankUsage {
  return {
    pairs: usage?.pairs ?? 0,
    tokens: Number(usage?.tokens ?? 0n),
    cachedPairs: usage?.cachedPairs ?? 0,
    truncatedDocuments: usage?.truncatedDocuments ?? 0,
  };
}

export function toTiming(timing: Timing | undefined): RerankTiming {
  return {
    tokenizationUs: Number(timing?.tokenizationUs ?? 0n),
    queueUs: Number(timing?.queueUs ?? 0n),
    inferenceUs: Number(timing?.inferenceUs ?? 0n),
    totalUs: Number(timing?.totalUs ?? 0n),
  };
}
