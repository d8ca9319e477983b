import { CancelledError, DeadlineExceededError, toRagSidecarError } from "./errors.js";

/** Options every call accepts. */
export interface CallOptions {
  /** Aborting it cancels the call; the promise rejects with CancelledError. */
  readonly signal?: AbortSignal | undefined;
  /**
   * Deadline of this call in milliseconds (DeadlineExceededError when it passes); overrides defaultTimeoutMs.
   * 0 or less means no deadline at all.
   */
  readonly timeoutMs?: number | undefined;
}

/** connect call options from ours. */
export function callOptions(options: CallOptions): { signal?: AbortSignal; timeoutMs?: number } {
  return {
    ...(options.signal ? { signal: options.signal } : {}),
    ...(options.timeoutMs !== undefined ? { timeoutMs: options.timeoutMs } : {}),
  };
}

/** Calls a connect method with our options; a failure rejects with the typed RagSidecarError it maps to. */
export async function callMapped<Req, Res>(
  rpc: (request: Req, options: object) => Promise<Res>,
  request: Req,
  options: CallOptions,
): Promise<Res> {
  try {
    return await rpc(request, callOptions(options));
  } catch (error) {
    throw toRagSidecarError(error);
  }
}

/** Races a promise with a caller's signal and timeout, mapping both to typed errors. */
export function raceWithOptions<T>(promise: Promise<T>, options: CallOptions): Promise<T> {
  const { signal, timeoutMs } = options;
  if (!signal && timeoutMs === undefined) return promise;
  return new Promise<T>((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      cleanup();
      reject(new CancelledError("operation cancelled", { code: "CANCELLED", cause: signal?.reason }));
    };
    const cleanup = () => {
      if (timer) clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    };
    if (signal?.aborted) return onAbort();
    signal?.addEventListener("abort", onAbort, { once: true });
    if (timeoutMs !== undefined) {
      timer = setTimeout(() => {
        cleanup();
        reject(new DeadlineExceededError(`no answer within ${timeoutMs} ms`, { code: "DEADLINE_EXCEEDED" }));
      }, timeoutMs);
    }
    promise.then(
      (value) => {
        cleanup();
        resolve(value);
      },
      (error: unknown) => {
        cleanup();
        reject(error);
      },
    );
  });
}
