// Error mapping from status + google.rpc details, without a server: errors as they arrive from the wire.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.ts";
import {
  CancelledError,
  FailedPreconditionError,
  KnowledgeNotReadyError,
  NotFoundError,
  PermissionDeniedError,
  RagSidecarError,
  ResourceExhaustedError,
  UnavailableError,
  UnknownBindingError,
  UnknownModelError,
  ValidationError,
  toRagSidecarError,
} from "../src/index.ts";

function wireError(code: Code, reason: string, extra: { metadata?: Record<string, string>; violations?: [string, string][] } = {}) {
  const details: { type: string; value: Uint8Array }[] = [
    {
      type: ErrorInfoSchema.typeName,
      value: toBinary(ErrorInfoSchema, create(ErrorInfoSchema, { reason, domain: "ragsidecar.dev", metadata: extra.metadata ?? {} })),
    },
  ];
  if (extra.violations) {
    details.push({
      type: BadRequestSchema.typeName,
      value: toBinary(
        BadRequestSchema,
        create(BadRequestSchema, { fieldViolations: extra.violations.map(([field, description]) => ({ field, description })) }),
      ),
    });
  }
  // As it arrives in grpc-status-details-bin: incoming details are type URLs with binary values.
  const error = new ConnectError("boom", code);
  error.details = details;
  return error;
}

describe("error mapping", () => {
  it("maps reasons before codes and keeps reason, metadata and violations", () => {
    const notReady = toRagSidecarError(
      wireError(Code.FailedPrecondition, "KNOWLEDGE_NOT_READY", {
        metadata: { sources: "a,b" },
        violations: [["knowledge[a]", "empty"]],
      }),
    );
    assert.ok(notReady instanceof KnowledgeNotReadyError);
    assert.ok(notReady instanceof RagSidecarError);
    assert.equal(notReady.code, "FAILED_PRECONDITION");
    assert.equal(notReady.grpcCode, 9);
    assert.equal(notReady.reason, "KNOWLEDGE_NOT_READY");
    assert.deepEqual(notReady.metadata, { sources: "a,b" });
    assert.deepEqual(notReady.violations, [{ field: "knowledge[a]", description: "empty" }]);
    assert.equal(notReady.message, "boom");
    assert.ok(notReady.cause instanceof ConnectError);

    assert.ok(notReady instanceof FailedPreconditionError);
    for (const reason of ["DIRECT_BUDGET_EXCEEDED", "UNKNOWN_MODEL_WINDOW", "SOURCE_UNREADABLE"]) {
      const failed = toRagSidecarError(wireError(Code.FailedPrecondition, reason, { metadata: { sources: "faq" } }));
      assert.equal(failed.constructor, FailedPreconditionError);
      assert.equal(failed.reason, reason);
      assert.equal(failed.metadata.sources, "faq");
    }
    assert.ok(toRagSidecarError(wireError(Code.NotFound, "UNKNOWN_MODEL")) instanceof UnknownModelError);
    const unknownBinding = toRagSidecarError(wireError(Code.NotFound, "UNKNOWN_BINDING"));
    assert.equal(unknownBinding.constructor, UnknownBindingError);
    assert.ok(unknownBinding instanceof NotFoundError && !(unknownBinding instanceof UnknownModelError));
    assert.ok(toRagSidecarError(wireError(Code.NotFound, "UNKNOWN_MODEL")) instanceof NotFoundError);
    assert.equal(toRagSidecarError(new ConnectError("gone", Code.NotFound)).constructor, NotFoundError);
    assert.ok(toRagSidecarError(wireError(Code.InvalidArgument, "LIMIT_EXCEEDED")) instanceof ValidationError);
    assert.ok(toRagSidecarError(wireError(Code.PermissionDenied, "PATH_OUTSIDE_ROOTS")) instanceof PermissionDeniedError);
    const full = toRagSidecarError(wireError(Code.ResourceExhausted, "QUEUE_FULL"));
    assert.ok(full instanceof ResourceExhaustedError);
    assert.equal(full.reason, "QUEUE_FULL");
    const notLoaded = toRagSidecarError(wireError(Code.Unavailable, "MODEL_NOT_READY"));
    assert.ok(notLoaded instanceof UnavailableError);
    assert.equal(notLoaded.reason, "MODEL_NOT_READY");
    const storeDown = toRagSidecarError(wireError(Code.Unavailable, "STORE_UNAVAILABLE"));
    assert.ok(storeDown instanceof UnavailableError);
    assert.equal(storeDown.reason, "STORE_UNAVAILABLE");
    const warming = toRagSidecarError(wireError(Code.Unavailable, "WARMING_UP"));
    assert.equal(warming.constructor, UnavailableError);
    assert.equal(warming.reason, "WARMING_UP");
  });

  it("maps statuses without details, aborts and foreign errors", () => {
    const plain = toRagSidecarError(new ConnectError("internal error", Code.Internal));
    assert.equal(plain.constructor, RagSidecarError);
    assert.equal(plain.code, "INTERNAL");
    assert.equal(plain.reason, "");
    assert.deepEqual(plain.violations, []);
    assert.ok(toRagSidecarError(new DOMException("aborted", "AbortError")) instanceof CancelledError);
    assert.equal(toRagSidecarError(new Error("x")).code, "UNKNOWN");
    const same = new ValidationError("v", { code: "INVALID_ARGUMENT" });
    assert.equal(toRagSidecarError(same), same);
  });
});
