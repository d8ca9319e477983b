// RerankerService through the facade, against the real sidecar and its real models.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  noOpReranker,
  RagSidecarError,
  UnknownModelError,
  ValidationError,
  type RagSidecarClient,
} from "../src/index.ts";
import { SidecarReranker } from "../src/reranker.ts";
import { BI_ENCODER, CROSS_ENCODER, Clients, servers } from "./support/fixture.ts";

const DOCS = [
  { id: "cooking", text: "Slow-cook the onions in butter for forty minutes until they caramelize.", metadata: { kind: "recipe" } },
  { id: "paris", text: "Paris is the capital and largest city of France, on the river Seine.", metadata: { kind: "geo", lang: "en" } },
  { id: "python", text: "Python lists are mutable sequences that can hold items of any type." },
];
const QUERY = "What is the capital of France?";

describe("reranker", () => {
  const clients = new Clients();
  let client: RagSidecarClient;

  before(async () => {
    const { plain } = await servers();
    client = clients.make({ address: plain.address });
    await client.reranker.ready({ timeoutMs: 10_000 });
  });
  after(() => clients.closeAll());

  it("ranks the relevant document first, with scores in 0..1 in descending order", async () => {
    const response = await client.reranker.rerank({ query: QUERY, documents: DOCS });
    assert.equal(response.model, CROSS_ENCODER);
    assert.deepEqual(response.results.map((r) => r.id).sort(), ["cooking", "paris", "python"]);
    assert.equal(response.results[0]?.id, "paris");
    assert.equal(response.results[0]?.index, 1);
    for (const r of response.results) {
      assert.ok(r.relevanceScore >= 0 && r.relevanceScore <= 1, `relevance ${r.relevanceScore}`);
      assert.equal(r.id, DOCS[r.index]?.id);
      assert.equal(r.document, undefined);
    }
    const scores = response.results.map((r) => r.relevanceScore);
    assert.deepEqual(scores, [...scores].sort((a, b) => b - a));
    assert.ok(response.results[0]!.rawScore > response.results[2]!.rawScore);
    assert.equal(response.usage.pairs, 3);
    assert.ok(response.timing.totalUs > 0);
  });

  it("applies topN and returns documents with their metadata when asked", async () => {
    const response = await client.reranker.rerank({ query: QUERY, documents: DOCS, topN: 1, returnDocuments: true });
    assert.equal(response.results.length, 1);
    assert.deepEqual(response.results[0]?.document, DOCS[1]);
    const none = await client.reranker.rerank({ query: QUERY, documents: DOCS, topN: 0 });
    assert.deepEqual(none.results, []);
  });

  it("scores with the bi-encoder when named, and takes bare strings as documents", async () => {
    const response = await client.reranker.rerank({
      query: QUERY,
      documents: DOCS.map((d) => d.text),
      model: BI_ENCODER,
      returnDocuments: true,
    });
    assert.equal(response.model, BI_ENCODER);
    assert.equal(response.results[0]?.index, 1);
    assert.equal(response.results[0]?.id, "");
    assert.deepEqual(response.results[0]?.document, { id: "", text: DOCS[1]!.text, metadata: {} });
  });

  it("answers supports() synchronously from the model snapshot, case-sensitively", async () => {
    assert.equal(client.reranker.supports(CROSS_ENCODER), true);
    assert.equal(client.reranker.supports(BI_ENCODER), true);
    // As the Reranker SPI (and the Java client) say: "" and unset are not model identifiers.
    assert.equal(client.reranker.supports(""), false);
    assert.equal(client.reranker.supports(), false);
    assert.equal(client.reranker.supports(CROSS_ENCODER.toUpperCase()), false);
    assert.equal(client.reranker.supports("no-such-model"), false);
    const snapshot = client.reranker.snapshot();
    assert.ok(snapshot);
    assert.deepEqual(
      snapshot.models.map((m) => [m.id, m.kind, m.state, m.isDefault]),
      [
        [CROSS_ENCODER, "cross-encoder", "ready", true],
        [BI_ENCODER, "bi-encoder", "ready", false],
      ],
    );
    assert.equal(snapshot.models[0]?.maxInputTokens, 512);
  });

  it("answers false before the first snapshot, then true once ready() resolves, refreshing in the background", async () => {
    const { plain } = await servers();
    const fresh = clients.make({ address: plain.address, modelRefreshMs: 50 });
    assert.equal(fresh.reranker.supports(CROSS_ENCODER), false);
    assert.equal(fresh.reranker.snapshot(), undefined);
    await fresh.reranker.ready();
    assert.equal(fresh.reranker.supports(CROSS_ENCODER), true);
    const first = fresh.reranker.snapshot()!.fetchedAt;
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.ok(fresh.reranker.snapshot()!.fetchedAt > first, "the snapshot is refreshed in the background");
  });

  it("maps an unknown model to UnknownModelError with reason UNKNOWN_MODEL", async () => {
    for (const model of ["no-such-model", CROSS_ENCODER.toUpperCase()]) {
      await assert.rejects(client.reranker.rerank({ query: QUERY, documents: DOCS, model }), (error: unknown) => {
        assert.ok(error instanceof UnknownModelError);
        assert.ok(error instanceof RagSidecarError);
        assert.equal(error.code, "NOT_FOUND");
        assert.equal(error.reason, "UNKNOWN_MODEL");
        return true;
      });
    }
  });

  it("maps a malformed request to ValidationError naming every field at fault", async () => {
    await assert.rejects(
      client.reranker.rerank({
        query: "   ",
        documents: [
          { id: "a", text: "one" },
          { id: "a", text: "two" },
        ],
        topN: -1,
      }),
      (error: unknown) => {
        assert.ok(error instanceof ValidationError);
        assert.equal(error.code, "INVALID_ARGUMENT");
        assert.equal(error.reason, "INVALID_REQUEST");
        const fields = error.violations.map((v) => v.field);
        for (const field of ["query", "documents[1].id", "top_n"]) {
          assert.ok(fields.includes(field), `${field} in ${JSON.stringify(error.violations)}`);
        }
        assert.ok(error.violations.every((v) => v.description.length > 0));
        return true;
      },
    );
    await assert.rejects(client.reranker.rerank({ query: QUERY, documents: [] }), (error: unknown) => {
      assert.ok(error instanceof ValidationError);
      assert.deepEqual(error.violations.map((v) => v.field), ["documents"]);
      return true;
    });
  });
});

describe("reranker SPI invariants (stubbed transport)", () => {
  const models = { models: [], generation: 0n, lastReloadError: "" };
  const stub = (results: { index: number; id: string }[]) =>
    new SidecarReranker({
      listModels: async () => models,
      rerank: async () => ({
        results: results.map((r) => ({ ...r, relevanceScore: 0.5, rawScore: 0, bestWindow: 0 })),
        model: "m",
      }),
    } as never);
  const request = { query: "q", documents: [{ id: "a", text: "x" }, { id: "b", text: "y" }] };

  it("refuses results that reference no request document, repeat one, or change its id", async () => {
    for (const bad of [[{ index: 2, id: "c" }], [{ index: 0, id: "a" }, { index: 0, id: "a" }], [{ index: 1, id: "a" }]]) {
      const reranker = stub(bad);
      await assert.rejects(reranker.rerank(request), (error: unknown) => {
        assert.ok(error instanceof RagSidecarError);
        assert.equal(error.code, "INTERNAL");
        assert.equal(error.reason, "INVALID_RESPONSE");
        return true;
      });
      reranker.stop();
    }
  });

  it("applies topN to the response even when the server returns more", async () => {
    const reranker = stub([{ index: 1, id: "b" }, { index: 0, id: "a" }]);
    const response = await reranker.rerank({ ...request, topN: 1 });
    assert.deepEqual(response.results.map((r) => r.id), ["b"]);
    reranker.stop();
  });
});

describe("noOpReranker", () => {
  it("supports nothing and keeps the request order", async () => {
    const reranker = noOpReranker();
    assert.equal(reranker.supports(CROSS_ENCODER), false);
    assert.equal(reranker.supports(), false);
    assert.equal(reranker.supports(""), false);
    await reranker.ready();
    const response = await reranker.rerank({ query: QUERY, documents: DOCS, topN: 2, returnDocuments: true });
    assert.deepEqual(response.results.map((r) => [r.index, r.id]), [[0, "cooking"], [1, "paris"]]);
    assert.ok(response.results.every((r) => Number.isNaN(r.relevanceScore) && Number.isNaN(r.rawScore)), "unscored");
    assert.deepEqual(response.results[1]?.document, DOCS[1]);
    await assert.rejects(reranker.rerank({ query: QUERY, documents: DOCS, topN: -1 }), ValidationError);
  });
});
