import assert from "node:assert/strict";
import type { RagSidecarError } from "../../src/index.ts";

/** Asserts a rejection's class, code and reason; returns the error for further checks. */
export async function rejection<E extends RagSidecarError>(
  promise: Promise<unknown>,
  errorClass: new (...args: never[]) => E,
  code: string,
  reason: string,
): Promise<E> {
  let caught: unknown;
  await assert.rejects(promise, (error: unknown) => {
    caught = error;
    return true;
  });
  assert.ok(caught instanceof errorClass, `expected ${errorClass.name}, got ${String(caught)}`);
  assert.equal(caught.code, code);
  assert.equal(caught.reason, reason);
  return caught;
}
