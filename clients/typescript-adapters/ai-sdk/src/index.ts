// The sidecar's reranker as an AI SDK reranking model, for `rerank()` from "ai": specification v3, which `ai` 6 takes
// (Node 18+) and `ai` 7 still accepts (Node 22+), so the adapter runs on the Node 20 this repository supports.
import type { JSONObject, RerankingModelV3, RerankingModelV3CallOptions, SharedV3Warning } from "@ai-sdk/provider";
import { ValidationError, type LongDocumentStrategyName, type RagSidecarClient, type Reranker } from "@ragsidecar/client";

/** Per-call options, under `providerOptions.ragsidecar` of `rerank()`. */
export interface RagSidecarRerankOptions {
  /** Drop documents whose relevance is below this threshold (0..1). */
  readonly minRelevanceScore?: number;
  /** Cap on each document's tokens, below the model's window. */
  readonly maxDocumentTokens?: number;
  /** What to do with documents longer than the window; unset uses the model's default. */
  readonly longDocumentStrategy?: LongDocumentStrategyName;
}

/**
 * A reranking model served by the sidecar. `modelId` is a model id the sidecar serves (case-sensitive, as
 * `client.reranker.supports()` takes it); an unknown one fails the call with the client's UnknownModelError.
 * The ranking only references the given documents, each at most once, in descending relevance, cut to topN
 * after scoring. Object documents are scored as their JSON text. An empty ranking of a non-empty input, and
 * request headers (the sidecar is reached over gRPC), are reported as the call's warnings, which the AI SDK
 * logs (its AI_SDK_LOG_WARNINGS global decides where).
 */
export function ragsidecarReranking(
  source: RagSidecarClient | Reranker,
  modelId: string,
): RerankingModelV3 {
  if (modelId.trim() === "") {
    throw new ValidationError("modelId must name a reranker model the sidecar serves", {
      code: "INVALID_ARGUMENT",
      reason: "INVALID_REQUEST",
    });
  }
  const reranker = "reranker" in source ? source.reranker : source;
  return {
    specificationVersion: "v3",
    provider: "ragsidecar",
    modelId,
    async doRerank(options: RerankingModelV3CallOptions) {
      const texts = options.documents.type === "text" ? options.documents.values : options.documents.values.map(jsonText);
      const extra = rerankOptions(options.providerOptions?.["ragsidecar"]);
      const response = await reranker.rerank(
        { query: options.query, documents: texts, model: modelId, ...(options.topN !== undefined ? { topN: options.topN } : {}), ...extra },
        options.abortSignal ? { signal: options.abortSignal } : {},
      );
      const warnings: SharedV3Warning[] = [];
      if (response.results.length === 0 && texts.length > 0) {
        warnings.push({ type: "other", message: `no result for ${texts.length} documents (minRelevanceScore or topN 0)` });
      }
      if (options.headers && Object.keys(options.headers).length > 0) {
        warnings.push({ type: "unsupported", feature: "headers", details: "the sidecar is called over gRPC; configure the client instead" });
      }
      return {
        // The client checked that every result references a sent document once and applied topN after scoring.
        ranking: response.results.map((r) => ({ index: r.index, relevanceScore: r.relevanceScore })),
        response: { modelId: response.model || modelId, timestamp: new Date() },
        warnings,
        providerMetadata: { ragsidecar: { pairs: response.usage.pairs, tokens: response.usage.tokens, totalUs: response.timing.totalUs } },
      };
    },
  };
}

function jsonText(value: JSONObject): string {
  return JSON.stringify(value);
}

function rerankOptions(options: Record<string, unknown> | undefined): RagSidecarRerankOptions {
  if (options === undefined) return {};
  const { minRelevanceScore, maxDocumentTokens, longDocumentStrategy } = options as RagSidecarRerankOptions;
  return {
    ...(minRelevanceScore !== undefined ? { minRelevanceScore } : {}),
    ...(maxDocumentTokens !== undefined ? { maxDocumentTokens } : {}),
    ...(longDocumentStrategy !== undefined ? { longDocumentStrategy } : {}),
  };
}
