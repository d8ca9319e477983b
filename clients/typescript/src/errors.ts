import { Code, ConnectError } from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** The error domain of every google.rpc.ErrorInfo the sidecar sends. */
export const ERROR_DOMAIN = "ragsidecar.dev";

/** Canonical gRPC status names, as `RagSidecarError.code` carries them. */
export type StatusCodeName =
  | "CANCELLED"
  | "UNKNOWN"
  | "INVALID_ARGUMENT"
  | "DEADLINE_EXCEEDED"
  | "NOT_FOUND"
  | "ALREADY_EXISTS"
  | "PERMISSION_DENIED"
  | "RESOURCE_EXHAUSTED"
  | "FAILED_PRECONDITION"
  | "ABORTED"
  | "OUT_OF_RANGE"
  | "UNIMPLEMENTED"
  | "INTERNAL"
  | "UNAVAILABLE"
  | "DATA_LOSS"
  | "UNAUTHENTICATED";

const CODE_NAMES: Record<number, StatusCodeName> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

/** One problem of a malformed request (google.rpc.BadRequest.FieldViolation), e.g. field "documents[1].id". */
export interface FieldViolation {
  readonly field: string;
  readonly description: string;
}

export interface RagSidecarErrorInit {
  readonly code: StatusCodeName;
  /** ErrorInfo.reason (the ErrorReason name without "ERROR_REASON_"), or "" when the server sent none. */
  readonly reason?: string;
  /** ErrorInfo.metadata. */
  readonly metadata?: Readonly<Record<string, string>>;
  readonly violations?: readonly FieldViolation[];
  readonly cause?: unknown;
}

/** Base class of every error the client throws for a failed call. */
export class RagSidecarError extends Error {
  /** Canonical gRPC status name, e.g. "NOT_FOUND". */
  readonly code: StatusCodeName;
  /** Numeric gRPC status code (same numbering as connect's `Code`). */
  readonly grpcCode: number;
  /** Stable machine-readable reason from google.rpc.ErrorInfo, e.g. "UNKNOWN_MODEL"; "" when absent. */
  readonly reason: string;
  /** ErrorInfo.metadata (e.g. metadata.sources for KNOWLEDGE_NOT_READY). */
  readonly metadata: Readonly<Record<string, string>>;
  /** BadRequest field violations; empty unless the request was malformed. */
  readonly violations: readonly FieldViolation[];

  constructor(message: string, init: RagSidecarErrorInit) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.code = init.code;
    this.grpcCode = codeNumber(init.code);
    this.reason = init.reason ?? "";
    this.metadata = Object.freeze({ ...(init.metadata ?? {}) });
    this.violations = Object.freeze([...(init.violations ?? [])]);
  }
}

/** NOT_FOUND: the named resource does not exist (see the subclasses for the sidecar's reasons). */
export class NotFoundError extends RagSidecarError {}
/** NOT_FOUND, reason UNKNOWN_MODEL: the named model is not configured on this sidecar. */
export class UnknownModelError extends NotFoundError {}
/**
 * NOT_FOUND, reason UNKNOWN_BINDING: the chat binding id is not open (closed, never opened, or lost when
 * the sidecar restarted: bindings live in its memory). Open the binding again.
 */
export class UnknownBindingError extends NotFoundError {}
/** INVALID_ARGUMENT: the request is malformed; `violations` names every field at fault. */
export class ValidationError extends RagSidecarError {}
/** UNAUTHENTICATED: the bearer token is missing or wrong. */
export class UnauthenticatedError extends RagSidecarError {}
/**
 * PERMISSION_DENIED: no principal, a path outside the knowledge roots (reason PATH_OUTSIDE_ROOTS), or a chat
 * binding used with another owner id, tenant or session than it was opened with (reason PERMISSION_DENIED).
 */
export class PermissionDeniedError extends RagSidecarError {}
/** RESOURCE_EXHAUSTED: a full queue (reason QUEUE_FULL; retry with backoff) or a size limit. */
export class ResourceExhaustedError extends RagSidecarError {}
/**
 * UNAVAILABLE: the sidecar cannot be reached, a model is not ready (reason MODEL_NOT_READY), or the shared store's
 * database is unreachable (reason STORE_UNAVAILABLE). Transient: retry with backoff.
 */
export class UnavailableError extends RagSidecarError {}
/** DEADLINE_EXCEEDED: the call's timeout passed. */
export class DeadlineExceededError extends RagSidecarError {}
/** CANCELLED: the call was cancelled, typically through its AbortSignal. */
export class CancelledError extends RagSidecarError {}
/**
 * FAILED_PRECONDITION: the request is well-formed but the sidecar's state or sources do not allow it;
 * `reason` tells which (DIRECT_BUDGET_EXCEEDED, UNKNOWN_MODEL_WINDOW, SOURCE_UNREADABLE, ...) and
 * `metadata.sources` names the knowledge sources at fault when there are any.
 */
export class FailedPreconditionError extends RagSidecarError {}
/**
 * FAILED_PRECONDITION, reason KNOWLEDGE_NOT_READY: a knowledge source is missing or holds nothing yet;
 * `metadata.sources` lists them (comma-separated, sorted), `violations` says why per source.
 */
export class KnowledgeNotReadyError extends FailedPreconditionError {}
/** UNIMPLEMENTED: this sidecar does not serve the RPC (yet). */
export class UnimplementedError extends RagSidecarError {}

type ErrorClass = new (message: string, init: RagSidecarErrorInit) => RagSidecarError;

const BY_REASON: Record<string, ErrorClass> = {
  UNKNOWN_MODEL: UnknownModelError,
  UNKNOWN_BINDING: UnknownBindingError,
  KNOWLEDGE_NOT_READY: KnowledgeNotReadyError,
};

const BY_CODE: Partial<Record<StatusCodeName, ErrorClass>> = {
  INVALID_ARGUMENT: ValidationError,
  NOT_FOUND: NotFoundError,
  UNAUTHENTICATED: UnauthenticatedError,
  PERMISSION_DENIED: PermissionDeniedError,
  RESOURCE_EXHAUSTED: ResourceExhaustedError,
  UNAVAILABLE: UnavailableError,
  DEADLINE_EXCEEDED: DeadlineExceededError,
  CANCELLED: CancelledError,
  FAILED_PRECONDITION: FailedPreconditionError,
  UNIMPLEMENTED: UnimplementedError,
};

/**
 * Maps any error of a call (a ConnectError with google.rpc details, an AbortError, anything else) to the
 * typed class for its status and ErrorInfo reason. A RagSidecarError is returned unchanged.
 */
export function toRagSidecarError(error: unknown): RagSidecarError {
  if (error instanceof RagSidecarError) {
    return error;
  }
  const connectError = ConnectError.from(error);
  const code = connectError.code === Code.Internal && isMissingSocket(error)
    ? "UNAVAILABLE"
    : CODE_NAMES[connectError.code] ?? "UNKNOWN";
  let reason = "";
  let metadata: Record<string, string> = {};
  const violations: FieldViolation[] = [];
  try {
    const info = connectError.findDetails(ErrorInfoSchema).find((i) => i.domain === ERROR_DOMAIN)
      ?? connectError.findDetails(ErrorInfoSchema)[0];
    if (info) {
      reason = info.reason;
      metadata = { ...info.metadata };
    }
    for (const badRequest of connectError.findDetails(BadRequestSchema)) {
      for (const v of badRequest.fieldViolations) {
        violations.push({ field: v.field, description: v.description });
      }
    }
  } catch {
    // Undecodable details: keep the status alone.
  }
  const errorClass = BY_REASON[reason] ?? BY_CODE[code] ?? RagSidecarError;
  const message = connectError.rawMessage || code;
  return new errorClass(message, { code, reason, metadata, violations, cause: error });
}

/**
 * A connect() to a Unix socket file that does not exist (yet): the sidecar is not there, as with a refused TCP
 * connection, which connect-node maps to UNAVAILABLE but this one to INTERNAL.
 */
function isMissingSocket(error: unknown): boolean {
  const seen = new Set<unknown>();
  for (let cause = error; cause instanceof Error && !seen.has(cause); cause = cause.cause) {
    seen.add(cause);
    const { code, syscall } = cause as NodeJS.ErrnoException;
    if (syscall === "connect" && code === "ENOENT") return true;
  }
  return false;
}

function codeNumber(name: StatusCodeName): number {
  for (const [number, candidate] of Object.entries(CODE_NAMES)) {
    if (candidate === name) {
      return Number(number);
    }
  }
  return Code.Unknown;
}
