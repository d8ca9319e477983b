// defineSidecarRetrieval's lifecycle, every rule of the defineRetrieval seed. Most tests inject the read
// (`search` ranks a small in-test corpus with the real sidecar's Rerank: real server, real model), which
// makes every step observable; the last one drives the default read, the sidecar's real Search over the
// knowledge root's faq.jsonl.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  CancelledError,
  RetrievalBudgetError,
  RetrievalDuplicateError,
  RetrievalRejectedError,
  UnknownModelError,
  ValidationError,
  defineSidecarRetrieval,
  type OperationContext,
  type RagSidecarClient,
  type RetrievalState,
  type SidecarRetrievalDefinition,
  type SidecarSource,
} from "../src/index.ts";
import { Clients, servers } from "./support/fixture.ts";

const CORPUS = [
  { id: "paris", text: "Paris is the capital and largest city of France, on the river Seine." },
  { id: "berlin", text: "Berlin is the capital of Germany and its most populous city." },
  { id: "onions", text: "Slow-cook the onions in butter for forty minutes until they caramelize." },
  { id: "python", text: "Python lists are mutable sequences that can hold items of any type." },
  { id: "tides", text: "Tides are caused by the gravitational pull of the moon and the sun on the oceans." },
];

type Source = { sourceId: string; text: string; score: number };
type Result = { sources: Source[] };
type App = { canRead: boolean; model?: string };
type Context = OperationContext<App>;

function newState(): RetrievalState<Source> {
  return { queryCount: 0, seen: new Set<string>(), sources: [] };
}

function context(app: Partial<App> = {}, signal = new AbortController().signal): Context {
  return { app: { canRead: true, ...app }, signal };
}

describe("defineSidecarRetrieval", () => {
  const clients = new Clients();
  let client: RagSidecarClient;
  let searches: string[];

  /** The injected read: the real sidecar reranks the corpus; the best two hits are the sources. */
  const search = async (query: string, ctx: Context): Promise<Result> => {
    searches.push(query);
    const response = await client.reranker.rerank(
      { query, documents: CORPUS, topN: 2, ...(ctx.app.model ? { model: ctx.app.model } : {}) },
      { signal: ctx.signal },
    );
    return {
      sources: response.results.map((r) => ({ sourceId: r.id, text: CORPUS[r.index]!.text, score: r.relevanceScore })),
    };
  };

  function define(state: RetrievalState<Source>, overrides: Partial<SidecarRetrievalDefinition<string, Source, Result, App>> = {}) {
    return defineSidecarRetrieval<string, Source, Result, App>({
      id: "corpus-search",
      description: "Ranks the in-test corpus with the sidecar's reranker",
      prepare: (query) => query.trim(),
      assertInput(query) {
        if (!query) throw new TypeError("empty query");
      },
      state: () => state,
      limit: () => 3,
      search,
      ...overrides,
    });
  }

  before(async () => {
    const { plain } = await servers();
    client = clients.make({ address: plain.address });
    await client.reranker.ready();
  });
  after(() => clients.closeAll());

  it("runs the fixed lifecycle order and returns a receipt with sequence and timestamps", async () => {
    searches = [];
    const state = newState();
    const calls: string[] = [];
    let tick = 1_000;
    const runner = define(state, {
      tags: ["docs"],
      prepare: (query) => (calls.push("prepare"), query.trim()),
      assertInput: (query) => void calls.push(`assertInput:${query}`),
      limit: () => (calls.push("limit"), 3),
      key: (query) => (calls.push("key"), query.toLowerCase()),
      authorize: async (_query, { app }) => {
        calls.push("authorize");
        if (!app.canRead) throw new Error("may not read");
      },
      search: async (query, ctx) => (calls.push("search"), search(query, ctx)),
      assertResult: (result) => {
        calls.push("assertResult");
        if (result.sources.length === 0) throw new Error("nothing found");
      },
      sourceId: (source, _query, sequence) => (calls.push("sourceId"), `${sequence}:${source.sourceId}`),
      effects: [
        {
          id: "count",
          description: "annotates the receipt",
          handle(receipt) {
            calls.push("effect");
            receipt.extensions.sourceCount = receipt.result.sources.length;
          },
        },
      ],
      now: () => (tick += 10),
    });
    assert.equal(runner.id, "corpus-search");
    assert.deepEqual(runner.tags, ["docs"]);
    assert.equal(runner.effects.length, 1);

    const receipt = await runner.run("  What is the capital of France?  ", context());
    assert.deepEqual(calls, [
      "prepare",
      "assertInput:What is the capital of France?",
      "key",
      "limit",
      "authorize",
      "limit",
      "search",
      "assertResult",
      "sourceId",
      "sourceId",
      "effect",
    ]);
    assert.equal(receipt.retrievalId, "corpus-search");
    assert.equal(receipt.query, "What is the capital of France?");
    assert.equal(receipt.key, "what is the capital of france?");
    assert.equal(receipt.sequence, 1);
    assert.equal(receipt.startedAt, 1_010);
    assert.equal(receipt.completedAt, 1_020);
    assert.deepEqual(receipt.extensions, { sourceCount: 2 });
    // The real model ranks Paris first; sourceId() replaced the ids in the receipt and in the state.
    assert.equal(receipt.result.sources[0]?.sourceId, "1:paris");
    assert.deepEqual(state.sources.map((s) => s.sourceId), receipt.result.sources.map((s) => s.sourceId));
    assert.equal(state.queryCount, 1);
    assert.deepEqual([...state.seen], ["what is the capital of france?"]);
    assert.deepEqual(searches, ["What is the capital of France?"]);
  });

  it("reports a repeated query as a duplicate without reading again, before authorize", async () => {
    searches = [];
    const state = newState();
    let authorized = 0;
    const runner = define(state, { authorize: () => void (authorized += 1) });
    await runner.run("capital of Germany", context());
    await assert.rejects(runner.run(" capital of Germany ", context()), (error: unknown) => {
      assert.ok(error instanceof RetrievalDuplicateError);
      assert.ok(error instanceof RetrievalRejectedError);
      assert.equal(error.kind, "duplicate");
      assert.equal(error.retrievalId, "corpus-search");
      return true;
    });
    assert.equal(authorized, 1);
    assert.deepEqual(searches, ["capital of Germany"]);
    assert.equal(state.queryCount, 1);
  });

  it("keys queries canonically by default", async () => {
    const state = { queryCount: 0, seen: new Set<string>(), sources: [] as Source[] };
    const runner = defineSidecarRetrieval<{ q: string; k: number }, Source, Result, App>({
      id: "structured",
      description: "structured queries",
      assertInput: () => undefined,
      state: () => state,
      limit: () => 5,
      search: async ({ q }, ctx) => search(q, ctx),
    });
    await runner.run({ q: "ocean tides", k: 2 }, context());
    await assert.rejects(runner.run({ k: 2, q: "ocean tides" }, context()), RetrievalDuplicateError);
    await runner.run({ q: "ocean tides", k: 3 }, context());
    assert.equal(state.queryCount, 2);
  });

  it("enforces the budget from limit(context), with configurable reasons", async () => {
    const state = newState();
    const runner = define(state, {
      limit: () => 2,
      errors: {
        duplicate: "asked already",
        budget: (query) => `no budget left for ${JSON.stringify(query)}`,
      },
    });
    await runner.run("capital of France", context());
    await runner.run("capital of Germany", context());
    await assert.rejects(runner.run("ocean tides", context()), (error: unknown) => {
      assert.ok(error instanceof RetrievalBudgetError);
      assert.equal(error.kind, "budget");
      assert.equal(error.message, 'no budget left for "ocean tides"');
      return true;
    });
    await assert.rejects(runner.run("capital of France", context()), { name: "RetrievalDuplicateError", message: "asked already" });
    assert.ok(!state.seen.has(JSON.stringify("ocean tides")), "a query refused for budget is not reserved");
    assert.equal(state.queryCount, 2);

    const custom = define(newState(), { limit: () => 0, errors: { budget: () => new RangeError("spent") } });
    await assert.rejects(custom.run("anything", context()), RangeError);
  });

  it("does not reserve queries that assertInput or authorize reject", async () => {
    searches = [];
    const state = newState();
    const runner = define(state, {
      authorize: (_query, { app }) => {
        if (!app.canRead) throw new Error("may not read");
      },
    });
    await assert.rejects(runner.run("   ", context()), TypeError);
    await assert.rejects(runner.run("capital of France", context({ canRead: false })), /may not read/);
    assert.equal(state.seen.size, 0);
    assert.deepEqual(searches, []);
    const receipt = await runner.run("capital of France", context({ canRead: true }));
    assert.equal(receipt.sequence, 1);
  });

  it("keeps the key of a throwing execute (no refund) and does not count it", async () => {
    searches = [];
    const state = newState();
    const effects: number[] = [];
    const runner = define(state, { effects: [{ id: "e", description: "records", handle: (r) => void effects.push(r.sequence) }] });
    // The sidecar refuses the model: execute throws UnknownModelError.
    await assert.rejects(runner.run("capital of France", context({ model: "no-such-model" })), UnknownModelError);
    assert.ok(state.seen.has(JSON.stringify("capital of France")), "the default key is the query's canonical JSON");
    assert.equal(state.queryCount, 0);
    assert.deepEqual(effects, []);
    // The retry is reported as a duplicate instead of silently repeating the read.
    await assert.rejects(runner.run("capital of France", context()), RetrievalDuplicateError);
    assert.deepEqual(searches, ["capital of France"]);
    // A failed query spends no budget; the next success is sequence 1.
    const receipt = await runner.run("capital of Germany", context());
    assert.equal(receipt.sequence, 1);
    assert.deepEqual(effects, [1]);
  });

  it("leaves a query whose result assertResult rejects seen but not counted", async () => {
    const state = newState();
    const runner = define(state, {
      assertResult: (result) => {
        if ((result.sources[0]?.score ?? 0) < 0.5) throw new Error("not relevant enough");
      },
    });
    await assert.rejects(runner.run("how do I bake sourdough bread at home", context()), /not relevant enough/);
    assert.equal(state.queryCount, 0);
    assert.equal(state.sources.length, 0);
    await assert.rejects(runner.run("how do I bake sourdough bread at home", context()), RetrievalDuplicateError);
    const receipt = await runner.run("What is the capital of France?", context());
    assert.equal(receipt.sequence, 1);
    assert.equal(receipt.result.sources[0]?.sourceId, "paris");
  });

  it("runs effects after every accepted query, in order, with their receipts", async () => {
    const state = newState();
    const seen: string[] = [];
    const runner = define(state, {
      effects: [
        { id: "first", description: "1", handle: async (r) => void seen.push(`first:${r.sequence}`) },
        { id: "second", description: "2", handle: (r, ctx) => void seen.push(`second:${r.sequence}:${ctx.app.canRead}`) },
      ],
    });
    await runner.run("capital of France", context());
    await assert.rejects(runner.run("capital of France", context()), RetrievalDuplicateError);
    await runner.run("ocean tides", context());
    assert.deepEqual(seen, ["first:1", "second:1:true", "first:2", "second:2:true"]);
    assert.deepEqual(state.sources.map((s) => s.sourceId).slice(0, 1), ["paris"]);
    assert.equal(state.sources.length, 4);
  });

  it("passes the context's AbortSignal to the read; an aborted read keeps its key", async () => {
    const state = newState();
    const runner = define(state);
    const controller = new AbortController();
    const big = Array.from({ length: 300 }, (_, i) => ({ id: `n${i}`, text: `${i} ${"filler text about nothing in particular ".repeat(20)}` }));
    const slow = define(state, {
      search: async (query, ctx) => {
        const pending = client.reranker.rerank({ query, documents: big }, { signal: ctx.signal });
        controller.abort(); // while the call is in flight, however fast the sidecar answers it
        const response = await pending;
        return { sources: response.results.map((r) => ({ sourceId: r.id, text: "", score: r.relevanceScore })) };
      },
    });
    await assert.rejects(slow.run(`slow ${Date.now()}`, context({}, controller.signal)), CancelledError);
    assert.equal(state.seen.size, 1);
    assert.equal(state.queryCount, 0);
    // A signal aborted before the read reserves nothing.
    await assert.rejects(runner.run("capital of France", context({}, AbortSignal.abort())), CancelledError);
    assert.equal(state.seen.size, 1);
  });

  it("holds concurrent runs to the duplicate and budget rules", async () => {
    searches = [];
    const state = newState();
    const runner = define(state, { limit: () => 2, authorize: async () => new Promise((r) => setTimeout(r, 20)) });
    const same = await Promise.allSettled([runner.run("capital of France", context()), runner.run("capital of France", context())]);
    assert.deepEqual(same.map((s) => s.status).sort(), ["fulfilled", "rejected"]);
    assert.ok((same.find((s) => s.status === "rejected") as PromiseRejectedResult).reason instanceof RetrievalDuplicateError);
    // One slot left: of two concurrent distinct queries, the in-flight one holds it.
    const distinct = await Promise.allSettled([runner.run("ocean tides", context()), runner.run("python lists", context())]);
    assert.equal(distinct.filter((s) => s.status === "fulfilled").length, 1);
    assert.ok((distinct.find((s) => s.status === "rejected") as PromiseRejectedResult).reason instanceof RetrievalBudgetError);
    assert.equal(state.queryCount, 2);
    assert.equal(searches.length, 2);
  });

  it("reads through the sidecar's Search by default: hits become sources, failures keep the key reserved", async () => {
    type Sources = { sourceId: string; source: string; text: string; documentId: string }[];
    const state = newSearchState();
    const effectSources: Sources = [];
    const runner = defineSidecarRetrieval<string, App>({
      id: "knowledge-search",
      description: "Search over declared knowledge",
      prepare: (query) => query.trim(),
      assertInput(query) {
        if (!query) throw new TypeError("empty query");
      },
      state: () => state,
      limit: () => 2,
      client,
      request: (query) => ({
        principal: { id: "user-1" },
        scope: { tenant: "lifecycle", session: "s1" },
        target: {
          name: "com.acme.SupportRole",
          knowledge: [{ name: "faq", type: "FILE", use: "SEARCH", path: "faq.jsonl", topK: 2 }],
        },
        query,
      }),
      sourceId: (source, _query, sequence) => `${sequence}:${source.chunk.provenance.documentId}`,
      effects: [
        {
          id: "collect",
          description: "keeps the sources",
          handle(receipt) {
            for (const s of receipt.result.sources) {
              effectSources.push({ sourceId: s.sourceId, source: s.source, text: s.text, documentId: s.chunk.provenance.documentId });
            }
          },
        },
      ],
    });
    const receipt = await runner.run("  how long does express shipping take?  ", context());
    assert.equal(receipt.sequence, 1);
    assert.equal(receipt.query, "how long does express shipping take?");
    const [top] = receipt.result.sources;
    assert.ok(top);
    assert.equal(top.sourceId, "1:faq-shipping");
    assert.equal(top.source, "faq");
    assert.match(top.text, /express shipping arrives the next business day/);
    assert.ok(top.score !== undefined && top.score > 0);
    assert.equal(top.relevance, undefined, "not reranked: no relevance");
    assert.equal(receipt.result.sources.length, 2);
    assert.equal(receipt.result.response.hits.length, 2);
    assert.deepEqual(state.sources.map((s) => s.sourceId), receipt.result.sources.map((s) => s.sourceId));
    assert.equal(effectSources[0]?.documentId, "faq-shipping");
    await assert.rejects(runner.run("how long does express shipping take?", context()), RetrievalDuplicateError);

    // A Search the sidecar refuses (an unknown reranker model) rejects typed; the key stays reserved.
    const failing = defineSidecarRetrieval<string, App>({
      id: "knowledge-search-bad-model",
      description: "Search with a reranker the sidecar does not have",
      assertInput: () => undefined,
      state: () => state,
      limit: () => 3,
      client,
      request: (query) => ({
        principal: { id: "user-1" },
        scope: { tenant: "lifecycle" },
        target: { name: "Docs", knowledge: [{ name: "faq", type: "FILE", use: "SEARCH", path: "faq.jsonl" }] },
        search: { rerank: true, rerankerModel: "no-such-reranker" },
        query,
      }),
    });
    await assert.rejects(failing.run("kettle capacity", context()), (error: unknown) => {
      assert.ok(error instanceof UnknownModelError, String(error));
      assert.equal(error.reason, "UNKNOWN_MODEL");
      return true;
    });
    assert.ok(state.seen.has(JSON.stringify("kettle capacity")));
    assert.equal(state.queryCount, 1);
    assert.throws(
      () => defineSidecarRetrieval({ id: "x", description: "x", assertInput: () => undefined, state: () => state, limit: () => 1 } as never),
      TypeError,
    );
  });
});

function newSearchState(): RetrievalState<SidecarSource> {
  return { queryCount: 0, seen: new Set<string>(), sources: [] };
}
