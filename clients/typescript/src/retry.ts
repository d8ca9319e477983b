import type { DescMethod } from "@bufbuild/protobuf";
import { MethodOptions_IdempotencyLevel } from "@bufbuild/protobuf/wkt";
import {
  Code,
  ConnectError,
  createContextKey,
  createContextValues,
  type Interceptor,
  type Transport,
} from "@connectrpc/connect";
import { toRagSidecarError } from "./errors.js";

/**
 * What a call does, which decides its default deadline and whether the client may repeat it (docs/clients.md,
 * "Calls the clients retry"): "probe" (health check, ListModels), "read" (every other method the proto declares
 * NO_SIDE_EFFECTS or IDEMPOTENT: Rerank, Search, the read-only retrieval calls), "write" (everything else; never
 * retried). The Java client's CallKind.
 */
export type CallKind = "probe" | "read" | "write";

/**
 * How calls that are safe to repeat are retried after a transient failure: UNAVAILABLE (the sidecar is restarting,
 * warming up, or a model or the store is not ready), RESOURCE_EXHAUSTED with reason QUEUE_FULL (refused before any
 * work ran), or CANCELLED by the sidecar rather than the host (a sidecar shutting down cancels late calls). Each wait
 * is exponential backoff with jitter; the call's deadline bounds all attempts together. Same defaults as the Java
 * client's RetryPolicy.
 */
export interface RetryOptions {
  /** Attempts of one call, the first included (default 5); 1 never retries. */
  readonly maxAttempts?: number | undefined;
  /** The wait after the first failed attempt (default 250 ms). */
  readonly initialBackoffMs?: number | undefined;
  /** The longest wait between two attempts (default 5000 ms). */
  readonly maxBackoffMs?: number | undefined;
  /** How much each wait grows over the previous one (default 2). */
  readonly backoffMultiplier?: number | undefined;
  /** Each wait is scaled by a random factor in [1 - jitter, 1 + jitter] (default 0.2). */
  readonly jitter?: number | undefined;
}

/** RetryOptions with every option given. */
export type RetryPolicy = { readonly [K in keyof RetryOptions]-?: NonNullable<RetryOptions[K]> };

export const DEFAULT_RETRY: RetryPolicy = {
  maxAttempts: 5,
  initialBackoffMs: 250,
  maxBackoffMs: 5_000,
  backoffMultiplier: 2,
  jitter: 0.2,
};

/** The deadline of a call that gives no timeoutMs of its own, per kind. */
export const DEFAULT_DEADLINES_MS: Readonly<Record<CallKind, number>> = { probe: 5_000, read: 30_000, write: 60_000 };

const PROBES = new Set(["grpc.health.v1.Health/Check", "ragsidecar.v1.RerankerService/ListModels"]);

/** The kind of a method, read from its descriptor: the proto's idempotency_level decides. */
export function callKind(method: DescMethod): CallKind {
  if (PROBES.has(`${method.parent.typeName}/${method.name}`)) return "probe";
  return method.idempotency === MethodOptions_IdempotencyLevel.IDEMPOTENCY_UNKNOWN ? "write" : "read";
}

/** The retry policy with every option given, checked. */
export function retryPolicy(options: RetryOptions | false | undefined): RetryPolicy {
  if (options === false) return { ...DEFAULT_RETRY, maxAttempts: 1 };
  const policy: RetryPolicy = { ...DEFAULT_RETRY, ...definedOnly(options ?? {}) };
  const { maxAttempts, initialBackoffMs, maxBackoffMs, backoffMultiplier, jitter } = policy;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1) throw new RangeError(`maxAttempts must be an integer >= 1: ${maxAttempts}`);
  if (!(initialBackoffMs > 0) || !(maxBackoffMs >= initialBackoffMs)) {
    throw new RangeError(`backoffs must be positive and maxBackoffMs >= initialBackoffMs: ${initialBackoffMs}, ${maxBackoffMs}`);
  }
  if (!(backoffMultiplier >= 1)) throw new RangeError(`backoffMultiplier must be at least 1: ${backoffMultiplier}`);
  if (!(jitter >= 0 && jitter <= 1)) throw new RangeError(`jitter must be in [0, 1]: ${jitter}`);
  return policy;
}

function definedOnly(options: RetryOptions): Partial<RetryPolicy> {
  return Object.fromEntries(Object.entries(options).filter(([, value]) => value !== undefined));
}

/**
 * The wait before attempt failedAttempts + 1: the backoff grown failedAttempts - 1 times, capped, then scaled by
 * 1 + jitter * (2 * random - 1) for a random in [0, 1).
 */
export function backoffMs(policy: RetryPolicy, failedAttempts: number, random: number): number {
  const grown = policy.initialBackoffMs * policy.backoffMultiplier ** (failedAttempts - 1);
  return Math.min(grown, policy.maxBackoffMs) * (1 + policy.jitter * (2 * random - 1));
}

/** Whether a failed attempt with this code and ErrorInfo reason is worth repeating (the call permitting). */
export function isTransient(code: Code, reason: string): boolean {
  return code === Code.Unavailable || (code === Code.ResourceExhausted && reason === "QUEUE_FULL");
}

/** When the call's deadline passes (Date.now() time), set by withDeadlines for the retry interceptor. */
const DEADLINE = createContextKey<number>(Infinity, { description: "ragsidecar call deadline" });

/**
 * The transport, with a unary call that gives no timeoutMs getting its kind's deadline, and a stream (health Watch,
 * through `raw`) the one given for all calls, if any: a stream lasts as long as the host listens.
 */
export function withDeadlines(transport: Transport, deadlines: Readonly<Record<CallKind, number>>,
  streamTimeoutMs: number | undefined): Transport {
  return {
    unary(method, signal, timeoutMs, header, input, values) {
      const effective = timeoutMs ?? deadlines[callKind(method)];
      const contextValues = values ?? createContextValues();
      if (effective > 0) contextValues.set(DEADLINE, Date.now() + effective);
      return transport.unary(method, signal, effective, header, input, contextValues);
    },
    stream(method, signal, timeoutMs, header, input, values) {
      return transport.stream(method, signal, timeoutMs ?? streamTimeoutMs, header, input, values);
    },
  };
}

/**
 * Repeats a unary call that is safe to repeat after a transient failure, per the policy; every other call, and
 * every other failure, passes through once. Interceptors after this one see each attempt.
 */
export function retrying(policy: RetryPolicy): Interceptor {
  return (next) => async (request) => {
    if (request.stream || callKind(request.method) === "write" || policy.maxAttempts === 1) return next(request);
    const deadline = request.contextValues.get(DEADLINE);
    for (let attempt = 1; ; attempt++) {
      try {
        return await next(request);
      } catch (error) {
        const wait = backoffMs(policy, attempt, Math.random());
        if (attempt >= policy.maxAttempts || !transient(error, request.signal) || Date.now() + wait >= deadline) {
          throw error;
        }
        await pause(wait, request.signal, error);
      }
    }
  };
}

function transient(error: unknown, signal: AbortSignal): boolean {
  if (signal.aborted) return false; // the host cancelled, or the deadline passed
  const failed = ConnectError.from(error);
  // A sidecar shutting down cancels the calls that reach it after it stopped taking new ones: gRPC answers them
  // CANCELLED, where it means UNAVAILABLE.
  const code = failed.code === Code.Canceled ? Code.Unavailable : failed.code;
  return isTransient(code, code === Code.ResourceExhausted ? toRagSidecarError(failed).reason : "");
}

/** Waits, or rejects with the last failure as soon as the call is cancelled or its deadline passes. */
function pause(ms: number, signal: AbortSignal, failure: unknown): Promise<void> {
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(failure);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
