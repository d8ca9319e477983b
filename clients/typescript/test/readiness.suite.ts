// awaitReady (a sidecar started after the client; a timeout that names the target), the host's interceptors, and
// errors that name an unreachable sidecar's address. The Java client's ConnectionTest checks the same.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { Interceptor } from "@connectrpc/connect";
import { DeadlineExceededError, UnauthenticatedError, UnavailableError } from "../src/index.ts";
import {
  CROSS_ENCODER, Clients, TOKEN, freePort, servers, socketPathFor, startLateSidecar, type Servers,
} from "./support/fixture.ts";

const REQUEST = {
  query: "What is the capital of France?",
  documents: [
    { id: "cooking", text: "Slow-cook the onions in butter for forty minutes until they caramelize." },
    { id: "paris", text: "Paris is the capital and largest city of France, on the river Seine." },
  ],
};

describe("readiness", () => {
  const clients = new Clients();
  let env: Servers;

  before(async () => {
    env = await servers();
  });
  after(() => clients.closeAll());

  it("awaitReady waits for a sidecar started after the client; supports() answers right after", async () => {
    const port = await freePort();
    const address = `127.0.0.1:${port}`;
    const client = clients.make({ address });
    assert.equal(client.target, address);
    let settled = false;
    const ready = client.awaitReady({ timeoutMs: 180_000 }).finally(() => (settled = true));
    await assert.rejects(client.reranker.rerank(REQUEST), (error: unknown) => {
      assert.ok(error instanceof UnavailableError, String(error));
      assert.ok(error.message.includes(address), error.message);
      return true;
    });
    assert.equal(client.reranker.supports(CROSS_ENCODER), false);
    assert.equal(settled, false, "awaitReady settled before the sidecar started");

    const late = await startLateSidecar({ port });
    try {
      const snapshot = await ready;
      assert.equal(client.reranker.supports(CROSS_ENCODER), true);
      assert.equal(snapshot.models.find((m) => m.isDefault)?.state, "ready");
      assert.equal((await client.reranker.rerank(REQUEST)).results[0]?.id, "paris");
    } finally {
      await late.stop();
    }
  });

  it("awaitReady waits for a Unix socket that does not exist yet", async () => {
    const socketPath = socketPathFor("late");
    const client = clients.make({ socketPath });
    assert.equal(client.target, `unix:${socketPath}`);
    const ready = client.awaitReady({ timeoutMs: 180_000 });
    // A missing socket file is an unreachable sidecar (as a refused TCP connection), not an internal error.
    await assert.rejects(client.reranker.rerank(REQUEST), (error: unknown) => {
      assert.ok(error instanceof UnavailableError, String(error));
      assert.ok(error.message.includes(socketPath), error.message);
      return true;
    });
    const late = await startLateSidecar({ socketPath });
    try {
      await ready;
      assert.equal(client.reranker.supports(CROSS_ENCODER), true);
    } finally {
      await late.stop();
    }
  });

  it("awaitReady rejects with DeadlineExceededError naming the target when the time is up", async () => {
    const address = `127.0.0.1:${await freePort()}`;
    await assert.rejects(clients.make({ address }).awaitReady({ timeoutMs: 1_500 }), (error: unknown) => {
      assert.ok(error instanceof DeadlineExceededError, String(error));
      assert.ok(error.message.includes(`sidecar ${address}`), error.message);
      assert.ok(error.message.includes("not SERVING within 1500 ms"), error.message);
      return true;
    });
  });

  it("awaitReady rejects at once when the sidecar refuses ListModels", async () => {
    const wrong = clients.make({ address: env.secured.address, token: "not-the-secret" });
    await assert.rejects(wrong.awaitReady({ timeoutMs: 60_000 }), UnauthenticatedError);
  });

  it("runs the host's interceptors in the given order, after the token was attached", async () => {
    const log: string[] = [];
    const recorder =
      (name: string): Interceptor =>
      (next) =>
      (request) => {
        log.push(`${name} ${request.method.name} ${request.header.has("authorization") ? "with" : "without"} token`);
        return next(request);
      };
    const client = clients.make({ address: env.secured.address, token: TOKEN, interceptors: [recorder("a"), recorder("b")] });
    await client.awaitReady({ timeoutMs: 60_000 });
    assert.ok(log.includes("a Check with token"), log.join("\n"));
    log.length = 0;
    assert.equal((await client.reranker.rerank(REQUEST)).results[0]?.id, "paris");
    assert.deepEqual(
      log.filter((entry) => entry.includes("Rerank")),
      ["a Rerank with token", "b Rerank with token"],
    );
  });
});
