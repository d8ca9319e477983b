// The retry policy: which calls it repeats (the table of docs/clients.md), its backoff, and a sidecar stopped and
// started again on the same port while a host keeps calling. The Java client's RetryTest checks the same.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import * as path from "node:path";
import { after, describe, it } from "node:test";
import { Code, type Interceptor } from "@connectrpc/connect";
import { ChatKnowledgeService } from "../src/gen/ragsidecar/v1/chat_knowledge_pb.js";
import { Health } from "../src/gen/grpc/health/v1/health_pb.js";
import { RerankerService } from "../src/gen/ragsidecar/v1/reranker_pb.js";
import { RetrievalService } from "../src/gen/ragsidecar/v1/retrieval_pb.js";
import { DEFAULT_DEADLINES_MS, DEFAULT_RETRY, UnavailableError, callKind } from "../src/index.ts";
import { backoffMs, isTransient, retryPolicy } from "../src/retry.ts";
import { Clients, freePort, startLateSidecar } from "./support/fixture.ts";
import { REPO_ROOT } from "./support/sidecar.ts";

const REQUEST = {
  query: "What is the capital of France?",
  documents: [
    { id: "cooking", text: "Slow-cook the onions in butter for forty minutes until they caramelize." },
    { id: "paris", text: "Paris is the capital and largest city of France, on the river Seine." },
  ],
};
const principal = { id: "agent-host" };
const scope = { tenant: "acme", session: "restart" };
const notes = { name: "notes", type: "MEMORY", use: "SEARCH" } as const;
const documents = [{ id: "n1", text: "Bob prefers delivery on Saturdays." }];

function documentedRetries(): string[] {
  const doc = readFileSync(path.join(REPO_ROOT, "docs", "clients.md"), "utf8");
  const table = doc.split("## Calls the clients retry")[1]?.split("\n## ")[0] ?? "";
  return [...table.matchAll(/^\| `([\w.]+\/\w+)` \|/gm)].map((row) => row[1] as string).sort();
}

describe("retries", () => {
  const clients = new Clients();
  after(() => clients.closeAll());

  it("retries exactly the calls docs/clients.md lists", () => {
    const retried = [RerankerService, RetrievalService, ChatKnowledgeService, Health]
      .flatMap((service) => service.methods)
      .filter((method) => callKind(method) !== "write")
      .map((method) => `${method.parent.typeName}/${method.name}`)
      .sort();
    assert.deepEqual(retried, documentedRetries());
    assert.equal(callKind(Health.method.check), "probe");
    assert.equal(callKind(RetrievalService.method.search), "read");
    assert.equal(callKind(RetrievalService.method.enforce), "write");
    assert.deepEqual(DEFAULT_DEADLINES_MS, { probe: 5_000, read: 30_000, write: 60_000 });
  });

  it("backs off exponentially to its cap, within the jitter", () => {
    assert.equal(DEFAULT_RETRY.maxAttempts, 5);
    assert.deepEqual([1, 2, 3, 4, 5, 6].map((n) => backoffMs(DEFAULT_RETRY, n, 0.5)), [250, 500, 1000, 2000, 4000, 5000]);
    assert.equal(backoffMs(DEFAULT_RETRY, 1, 0), 200);
    assert.equal(backoffMs(DEFAULT_RETRY, 1, 1), 300);
    assert.equal(retryPolicy(false).maxAttempts, 1);
    assert.throws(() => retryPolicy({ jitter: 1.5 }), RangeError);
    assert.ok(isTransient(Code.Unavailable, "WARMING_UP"));
    assert.ok(isTransient(Code.ResourceExhausted, "QUEUE_FULL"));
    assert.ok(!isTransient(Code.ResourceExhausted, "LIMIT_EXCEEDED"));
    assert.ok(!isTransient(Code.DeadlineExceeded, ""));
  });

  it("a stream the server refuses is UNAVAILABLE and retried; a refused write is not repeated", async () => {
    // A server that refuses every stream with RST_STREAM REFUSED_STREAM, as a sidecar that is shutting down does.
    const server = http2.createServer();
    server.on("stream", (stream) => {
      stream.on("error", () => {}); // the refusal itself, on the server's side
      stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const attempts = new Map<string, number>();
    const client = clients.make({
      address: `127.0.0.1:${(server.address() as AddressInfo).port}`,
      retry: { maxAttempts: 3, initialBackoffMs: 10, maxBackoffMs: 10 },
      interceptors: [(next) => (request) => {
        attempts.set(request.method.name, (attempts.get(request.method.name) ?? 0) + 1);
        return next(request);
      }],
    });
    try {
      await assert.rejects(client.reranker.rerank(REQUEST), UnavailableError);
      await assert.rejects(client.retrieval.upsertDocuments({ principal, scope, knowledge: "notes", documents }),
        UnavailableError);
      assert.deepEqual([attempts.get("Rerank"), attempts.get("UpsertDocuments")], [3, 1]);
    } finally {
      client.close();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it("calls succeed through a restart, and a write is never repeated", async () => {
    const port = await freePort();
    const attempts = new Map<string, number>();
    const counting: Interceptor = (next) => (request) => {
      attempts.set(request.method.name, (attempts.get(request.method.name) ?? 0) + 1);
      return next(request);
    };
    const first = await startLateSidecar({ port });
    let second: Awaited<ReturnType<typeof startLateSidecar>> | undefined;
    try {
      // Patient enough for a sidecar that takes a while to start on a busy machine.
      const client = clients.make({
        address: `127.0.0.1:${port}`,
        retry: { maxAttempts: 200, initialBackoffMs: 100, maxBackoffMs: 500 },
        deadlinesMs: { read: 180_000 },
        interceptors: [counting],
      });
      assert.equal((await client.retrieval.upsertDocuments({ principal, scope, knowledge: "notes", documents })).inserted, 1);

      // A host that keeps reranking: every call succeeds, before, during and after the restart.
      let keepCalling = true;
      let answered = 0;
      const failures: unknown[] = [];
      const host = (async () => {
        while (keepCalling) {
          try {
            assert.equal((await client.reranker.rerank(REQUEST)).results[0]?.id, "paris");
            answered++;
          } catch (error) {
            failures.push(error);
          }
        }
      })();
      const until = async (done: () => boolean) => {
        while (!done()) await new Promise((resolve) => setTimeout(resolve, 20));
      };
      await until(() => answered >= 3);
      await first.stop();
      // A write while the sidecar is down fails at once: it may have been applied, so it is never repeated.
      await assert.rejects(
        client.retrieval.upsertDocuments({ principal, scope, knowledge: "notes", documents }),
        UnavailableError,
      );
      assert.equal(attempts.get("UpsertDocuments"), 2);
      const searched = client.retrieval.search({ principal, scope, target: { name: "Notes", knowledge: [notes] }, query: "Bob" });
      second = await startLateSidecar({ port });
      await searched; // answered by the second sidecar (its own, empty, knowledge)
      const answeredAfterRestart = answered;
      await until(() => answered >= answeredAfterRestart + 3);
      keepCalling = false;
      await host;
      assert.deepEqual(failures, []);
      assert.ok((attempts.get("Rerank") ?? 0) > answered, `no Rerank was repeated: ${[...attempts]}`);
      assert.ok((attempts.get("Search") ?? 0) > 1, `the Search was not repeated: ${[...attempts]}`);
      assert.equal(attempts.get("UpsertDocuments"), 2);
      assert.equal((await client.retrieval.upsertDocuments({ principal, scope, knowledge: "notes", documents })).inserted, 1);
    } finally {
      await first.stop();
      await second?.stop();
    }
  });
});
