// Connection-level behaviour against the real sidecar: health, auth, AbortSignal, deadlines, Unix sockets,
// TLS, an unreachable sidecar.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, it } from "node:test";
import {
  CancelledError,
  DeadlineExceededError,
  RagSidecarError,
  UnauthenticatedError,
  UnavailableError,
  type RagSidecarClient,
  type RerankRequest,
} from "../src/index.ts";
import { CROSS_ENCODER, Clients, TOKEN, servers, tlsServer, type Servers } from "./support/fixture.ts";

const DOCS = [
  { id: "cooking", text: "Slow-cook the onions in butter for forty minutes until they caramelize." },
  { id: "paris", text: "Paris is the capital and largest city of France, on the river Seine." },
];
const QUERY = "What is the capital of France?";

/** A request that takes the sidecar seconds (one model run per document, cache-busted). */
function largeRequest(): RerankRequest {
  const salt = randomUUID();
  const filler = "the quick brown fox jumps over the lazy dog while the committee reviews the annual budget report ".repeat(12);
  return {
    query: `budget committee ${salt}`,
    documents: Array.from({ length: 400 }, (_, i) => ({ id: `d${i}`, text: `${salt} ${i} ${filler}` })),
  };
}

describe("client", () => {
  const clients = new Clients();
  let env: Servers;
  let client: RagSidecarClient;

  before(async () => {
    env = await servers();
    client = clients.make({ address: env.plain.address });
  });
  after(() => clients.closeAll());

  it("checks health, of the sidecar and of one model", async () => {
    assert.equal(await client.health.check(), "SERVING");
    assert.equal(await client.health.check(`ragsidecar.v1.RerankerService/${CROSS_ENCODER}`), "SERVING");
    await client.health.waitForServing({ timeoutMs: 1_000 });
  });

  it("requires the bearer token when the sidecar has one", async () => {
    const anonymous = clients.make({ address: env.secured.address });
    const wrong = clients.make({ address: env.secured.address, token: "not-the-secret" });
    for (const c of [anonymous, wrong]) {
      await assert.rejects(c.reranker.rerank({ query: QUERY, documents: DOCS }), (error: unknown) => {
        assert.ok(error instanceof UnauthenticatedError);
        assert.equal(error.code, "UNAUTHENTICATED");
        assert.equal(error.reason, "UNAUTHENTICATED");
        // Which sidecar refused the token, as the Java client says it.
        assert.ok(error.message.endsWith(` [sidecar ${env.secured.address}]`), error.message);
        return true;
      });
      // ready() rejects instead of waiting forever; supports() stays false.
      await assert.rejects(c.reranker.ready(), UnauthenticatedError);
      assert.equal(c.reranker.supports(CROSS_ENCODER), false);
      // Health never needs the token.
      assert.equal(await c.health.check(), "SERVING");
    }
    const authorized = clients.make({ address: env.secured.address, token: () => Promise.resolve(TOKEN) });
    await authorized.reranker.ready();
    assert.equal(authorized.reranker.supports(CROSS_ENCODER), true);
    const response = await authorized.reranker.rerank({ query: QUERY, documents: DOCS });
    assert.equal(response.results[0]?.id, "paris");
  });

  it("serves over a Unix socket", async () => {
    assert.ok(env.secured.socketPath);
    const overSocket = clients.make({ socketPath: env.secured.socketPath, token: TOKEN });
    assert.equal(await overSocket.health.check(), "SERVING");
    await overSocket.reranker.ready();
    assert.equal(overSocket.reranker.supports(CROSS_ENCODER), true);
    const response = await overSocket.reranker.rerank({ query: QUERY, documents: DOCS, topN: 1 });
    assert.deepEqual(response.results.map((r) => r.id), ["paris"]);
    await assert.rejects(
      clients.make({ socketPath: env.secured.socketPath }).reranker.rerank({ query: QUERY, documents: DOCS }),
      UnauthenticatedError,
    );
  });

  it("speaks TLS, trusting the sidecar's certificate through tls.ca", async (t) => {
    const tls = await tlsServer();
    if (!tls) return t.skip("openssl is not installed");
    const port = tls.sidecar.address.split(":").pop();
    const secure = clients.make({ address: `127.0.0.1:${port}`, tls: { ca: tls.ca } });
    assert.equal(await secure.health.check(), "SERVING");
    await secure.reranker.ready();
    const response = await secure.reranker.rerank({ query: QUERY, documents: DOCS });
    assert.equal(response.results[0]?.id, "paris");
    // Without the CA the self-signed certificate is refused; plaintext to the TLS port fails too.
    await assert.rejects(clients.make({ address: `127.0.0.1:${port}`, tls: true }).health.check(), (error: unknown) => {
      assert.ok(error instanceof RagSidecarError);
      assert.match(error.message, /certificate/);
      return true;
    });
    await assert.rejects(clients.make({ address: `127.0.0.1:${port}` }).health.check("", { timeoutMs: 2_000 }));
  });

  it("cancels a call in flight through its AbortSignal", async () => {
    const controller = new AbortController();
    const started = Date.now();
    const call = client.reranker.rerank(largeRequest(), { signal: controller.signal });
    setTimeout(() => controller.abort(), 150);
    await assert.rejects(call, (error: unknown) => {
      assert.ok(error instanceof CancelledError, String(error));
      assert.equal(error.code, "CANCELLED");
      return true;
    });
    assert.ok(Date.now() - started < 2_000, "the promise settles as soon as the signal aborts");
    // An already aborted signal fails at once, and the sidecar keeps serving.
    await assert.rejects(
      client.reranker.rerank({ query: QUERY, documents: DOCS }, { signal: AbortSignal.abort() }),
      CancelledError,
    );
    const response = await client.reranker.rerank({ query: QUERY, documents: DOCS });
    assert.equal(response.results[0]?.id, "paris");
  });

  it("fails with DeadlineExceededError when a call's timeout or the client's default timeout passes", async () => {
    await assert.rejects(client.reranker.rerank(largeRequest(), { timeoutMs: 100 }), (error: unknown) => {
      assert.ok(error instanceof DeadlineExceededError, String(error));
      assert.equal(error.code, "DEADLINE_EXCEEDED");
      return true;
    });
    const impatient = clients.make({ address: env.plain.address, defaultTimeoutMs: 100 });
    await assert.rejects(impatient.reranker.rerank(largeRequest()), DeadlineExceededError);
    // A call's own timeout overrides the default.
    const response = await impatient.reranker.rerank({ query: QUERY, documents: DOCS }, { timeoutMs: 30_000 });
    assert.equal(response.results[0]?.id, "paris");
  });

  it("maps an unreachable sidecar to UnavailableError", async () => {
    const nowhere = createUnreachable(clients);
    await assert.rejects(nowhere.reranker.rerank({ query: QUERY, documents: DOCS }), (error: unknown) => {
      assert.ok(error instanceof UnavailableError, String(error));
      assert.ok(error.message.endsWith(` [sidecar ${nowhere.target}]`), error.message);
      return true;
    });
    await assert.rejects(nowhere.health.waitForServing({ timeoutMs: 300, intervalMs: 50 }), DeadlineExceededError);
    assert.equal(nowhere.reranker.supports(CROSS_ENCODER), false);
  });

  it("closes: the background refresh stops and pending ready() rejects", async () => {
    const closing = createUnreachable(clients);
    const ready = closing.reranker.ready();
    closing.close();
    await assert.rejects(ready, CancelledError);
  });
});

function createUnreachable(clients: Clients): RagSidecarClient {
  // Port 1 on loopback: nothing listens there, the connection is refused at once.
  return clients.make({ address: "127.0.0.1:1" });
}
