import { createClient as createConnectClient, type Client } from "@connectrpc/connect";
import { Health, HealthCheckResponse_ServingStatus } from "./gen/grpc/health/v1/health_pb.js";
import { RerankerService } from "./gen/ragsidecar/v1/reranker_pb.js";
import { RetrievalService } from "./gen/ragsidecar/v1/retrieval_pb.js";
import { ChatKnowledgeService } from "./gen/ragsidecar/v1/chat_knowledge_pb.js";
import { CancelledError, DeadlineExceededError, toRagSidecarError } from "./errors.js";
import { callOptions, type CallOptions } from "./call.js";
import { SidecarReranker, type ModelSnapshot, type Reranker, type SnapshotOptions } from "./reranker.js";
import { retrievalClient, type RetrievalClient } from "./retrieval.js";
import { chatClient, type ChatClient } from "./chat.js";
import { openTransport, type ConnectionOptions } from "./transport.js";

export interface ClientOptions extends ConnectionOptions, SnapshotOptions {}

export type HealthStatus = "SERVING" | "NOT_SERVING" | "SERVICE_UNKNOWN" | "UNKNOWN";

/** The grpc.health.v1 service that is SERVING once the sidecar's default reranker model is ready. */
export const RERANKER_HEALTH_SERVICE = "ragsidecar.v1.RerankerService";

/** Pause between two health answers that were not SERVING: a sidecar that starts late is noticed this fast. */
const READINESS_POLL_MS = 200;

export interface HealthClient {
  /**
   * grpc.health.v1 Check: "" is the whole sidecar (SERVING once the default model is ready),
   * "ragsidecar.v1.RerankerService/<model>" one model. Health never needs the token.
   */
  check(service?: string, options?: CallOptions): Promise<HealthStatus>;
  /**
   * Polls check() until it answers SERVING; connection failures count as not serving yet. Past timeoutMs it
   * rejects with DeadlineExceededError naming the sidecar's address and the last answer.
   */
  waitForServing(options?: CallOptions & { readonly service?: string; readonly intervalMs?: number }): Promise<void>;
}

export interface RagSidecarClient {
  /** RerankerService: the host's Reranker SPI (supports from a cached model list, rerank). */
  readonly reranker: Reranker;
  /**
   * RetrievalService: validateConfiguration, enforce, requireLoaded, requireReady, prepareChatKnowledge,
   * search, upsertDocuments, deleteDocuments, with plain typed requests and results and typed errors.
   */
  readonly retrieval: RetrievalClient;
  /**
   * ChatKnowledgeService: groundTurn (the grounded outbound copy of a conversation, per-owner outcomes) and
   * the chat bindings (openBinding returns a handle with append, invalidate, close and Symbol.asyncDispose),
   * with plain typed requests and results and typed errors.
   */
  readonly chat: ChatClient;
  readonly health: HealthClient;
  /** Where the client connects: "host:port" (the address as given) or "unix:<socketPath>". */
  readonly target: string;
  /**
   * Resolves once the sidecar is ready for reranking: its health for RERANKER_HEALTH_SERVICE is SERVING (the
   * default model is loaded) and a model snapshot taken since then is cached, so `reranker.supports()` answers from
   * it. A sidecar started after the client is noticed within READINESS_POLL_MS. Rejects with DeadlineExceededError
   * naming the target when timeoutMs passes first (unset: waits until the signal aborts), and at once when the
   * sidecar refuses ListModels (a wrong token). The Java client's `awaitReady(Duration)` does the same.
   */
  awaitReady(options?: CallOptions): Promise<ModelSnapshot>;
  /** The generated connect clients, for anything the facade does not cover (errors stay ConnectError). */
  readonly raw: {
    readonly reranker: Client<typeof RerankerService>;
    readonly retrieval: Client<typeof RetrievalService>;
    readonly chat: Client<typeof ChatKnowledgeService>;
    readonly health: Client<typeof Health>;
  };
  /** Stops the model-list refresh and closes the connection (in-flight calls fail with UnavailableError). */
  close(): void;
}

/**
 * Connects to a ragsidecar. Nothing blocks: the connection opens on the first call, and the reranker's
 * model list is fetched in the background; `await client.awaitReady({ timeoutMs })` before asking
 * `reranker.supports()` at start-up (until the first snapshot, nothing is supported).
 */
export function createClient(options: ClientOptions): RagSidecarClient {
  const { transport, target, close } = openTransport(options);
  const raw = {
    reranker: createConnectClient(RerankerService, transport),
    retrieval: createConnectClient(RetrievalService, transport),
    chat: createConnectClient(ChatKnowledgeService, transport),
    health: createConnectClient(Health, transport),
  };
  const reranker = new SidecarReranker(raw.reranker, options);
  const health: HealthClient = {
    async check(service = "", callOpts = {}) {
      try {
        const response = await raw.health.check({ service }, callOptions(callOpts));
        return (HealthCheckResponse_ServingStatus[response.status] ?? "UNKNOWN") as HealthStatus;
      } catch (error) {
        throw toRagSidecarError(error);
      }
    },
    async waitForServing(waitOpts = {}) {
      const { signal, timeoutMs, service = "", intervalMs = 100 } = waitOpts;
      const deadline = timeoutMs === undefined ? Infinity : Date.now() + timeoutMs;
      let last = "no answer";
      for (;;) {
        const left = deadline - Date.now();
        try {
          const status = await health.check(service, {
            ...(signal ? { signal } : {}),
            timeoutMs: Math.max(1, Math.min(left, 2_000)),
          });
          if (status === "SERVING") return;
          last = status;
        } catch (error) {
          const mapped = toRagSidecarError(error);
          if (mapped.code !== "UNAVAILABLE" && mapped.code !== "DEADLINE_EXCEEDED") throw mapped;
          last = mapped.message;
        }
        if (signal?.aborted) {
          throw new CancelledError("operation cancelled", { code: "CANCELLED", cause: signal.reason });
        }
        if (Date.now() + intervalMs > deadline) {
          throw new DeadlineExceededError(
            `sidecar ${target}: ${service ? `${service} ` : ""}not SERVING within ${timeoutMs} ms; last: ${last}`,
            { code: "DEADLINE_EXCEEDED" },
          );
        }
        await new Promise((resolve) => setTimeout(resolve, intervalMs));
      }
    },
  };
  return {
    reranker,
    retrieval: retrievalClient(raw.retrieval),
    chat: chatClient(raw.chat),
    health,
    target,
    async awaitReady(readyOpts = {}) {
      const { signal, timeoutMs } = readyOpts;
      const deadline = timeoutMs === undefined ? Infinity : Date.now() + timeoutMs;
      await health.waitForServing({
        service: RERANKER_HEALTH_SERVICE,
        intervalMs: READINESS_POLL_MS,
        ...(signal ? { signal } : {}),
        ...(timeoutMs !== undefined ? { timeoutMs } : {}),
      });
      const left = deadline - Date.now();
      return reranker.refresh({ ...(signal ? { signal } : {}), ...(left !== Infinity ? { timeoutMs: Math.max(1, left) } : {}) });
    },
    raw,
    close() {
      reranker.stop();
      close();
    },
  };
}
