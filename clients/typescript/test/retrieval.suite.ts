// client.retrieval through the real sidecar: its one knowledge root holds the real files of
// support/knowledge.ts, and every RPC of RetrievalService runs against them (real embedder and reranker).
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  CancelledError,
  FailedPreconditionError,
  KnowledgeNotReadyError,
  PermissionDeniedError,
  UnknownModelError,
  ValidationError,
  retrieval_pb,
  type KnowledgeEntryInit,
  type RagSidecarClient,
  type ScopeInit,
  type TargetInit,
} from "../src/index.ts";
import { FAQ, STEPS } from "./support/knowledge.ts";
import { Clients, servers } from "./support/fixture.ts";
import { rejection } from "./support/assertions.ts";

const principal = { id: "agent-host" };
const scope: ScopeInit = { tenant: "acme", session: "s1" };
const llm = { model: "test-model", inputWindowTokens: 8000 };

const FAQ_ENTRY: KnowledgeEntryInit = { name: "faq", type: "FILE", use: "SEARCH", path: "faq.jsonl", topK: 3 };
const POLICIES: KnowledgeEntryInit = { name: "policies", type: "DIRECTORY", use: "SEARCH", path: "policies" };
const PERSONA: KnowledgeEntryInit = { name: "persona", type: "FILE", use: "DIRECT", path: "persona.md" };
// The generated enums work as well as the names.
const STEPS_ENTRY: KnowledgeEntryInit = {
  name: "steps",
  type: retrieval_pb.KnowledgeType.FILE,
  use: retrieval_pb.KnowledgeUse.SEQUENTIAL,
  path: "steps.jsonl",
};

function target(knowledge: readonly KnowledgeEntryInit[], answer: readonly string[] = [], queryParameter?: string): TargetInit {
  return {
    name: "com.acme.SupportRole",
    knowledge,
    actions: [{ name: "answer", knowledge: answer, ...(queryParameter ? { queryParameter } : {}) }],
  };
}

describe("retrieval", () => {
  const clients = new Clients();
  let client: RagSidecarClient;

  before(async () => {
    const { plain } = await servers();
    client = clients.make({ address: plain.address, defaultTimeoutMs: 60_000 });
  });
  after(() => clients.closeAll());

  it("validateConfiguration: valid, or every violation at once", async () => {
    const good = await client.retrieval.validateConfiguration({
      principal, scope, llm, target: target([FAQ_ENTRY, PERSONA, STEPS_ENTRY], ["faq", "persona"]),
    });
    assert.deepEqual(good, { valid: true, violations: [] });

    const bad = await client.retrieval.validateConfiguration({
      principal,
      scope,
      llm,
      target: target(
        [
          { name: "nofile", type: "FILE", use: "SEARCH" },
          { name: "escape", type: "FILE", use: "SEARCH", path: "../outside.md" },
          { name: "contradiction", type: "FILE", use: "SEARCH", path: "faq.jsonl", minScore: 1.5 },
          { name: "zero", type: "FILE", use: "SEARCH", path: "faq.jsonl", topK: 0 },
          { name: "blank", type: "INLINE", use: "DIRECT" },
          { name: "ghost", type: "FILE", use: "SEARCH", path: "faq.jsonl", search: { rerank: true, rerankerModel: "no-such-reranker" } },
        ],
        ["nofile", "missing-name"],
      ),
    });
    assert.equal(bad.valid, false);
    const found = new Set(bad.violations.map((v) => `${v.field} ${v.reason}`));
    for (const expected of [
      "target.knowledge[0].path INVALID_CONFIGURATION",
      "target.knowledge[1].path PATH_OUTSIDE_ROOTS",
      "target.knowledge[2].min_score INVALID_CONFIGURATION",
      "target.knowledge[3].top_k INVALID_CONFIGURATION",
      "target.knowledge[4].inline_text INVALID_CONFIGURATION",
      "target.knowledge[5].search.reranker_model UNKNOWN_MODEL",
      "target.actions[0].knowledge[1] UNKNOWN_KNOWLEDGE",
    ]) {
      assert.ok(found.has(expected), `${expected} in ${[...found].join("; ")}`);
    }
    assert.ok(bad.violations.every((v) => v.description.length > 0));

    // pathsPerRun: a FILE entry without a path is the host's to locate per run.
    const perRun = await client.retrieval.validateConfiguration({
      principal, scope, llm, pathsPerRun: true, target: target([{ name: "nofile", type: "FILE", use: "DIRECT" }]),
    });
    assert.equal(perRun.valid, true);

    // declarationsOnly: nothing is read or measured, so a DIRECT source needs no model window.
    const measured = await client.retrieval.validateConfiguration({ principal, scope, target: target([PERSONA], ["persona"]) });
    assert.ok(measured.violations.some((v) => v.reason === "UNKNOWN_MODEL_WINDOW"), JSON.stringify(measured.violations));
    const declared = await client.retrieval.validateConfiguration({
      principal, scope, declarationsOnly: true, target: target([PERSONA], ["persona"]),
    });
    assert.deepEqual(declared, { valid: true, violations: [] });
  });

  it("enforce: DIRECT knowledge whole, with the context keys as typed fields", async () => {
    const result = await client.retrieval.enforce({
      principal, scope, llm, target: target([PERSONA, FAQ_ENTRY], ["persona"]), action: "answer", params: { question: "hi" },
    });
    assert.match(result.retrievedContext, /^### Knowledge: persona \(DIRECT\)/);
    assert.match(result.retrievedContext, /You are Ada, a support agent for Acme Kitchen\./);
    assert.equal(result.documentCount, 1);
    assert.equal(result.truncated, false);
    assert.deepEqual(result.staleFallbacks, []);
    assert.equal(result.blocks.length, 1);
    assert.equal(result.blocks[0]?.use, "DIRECT");
    assert.equal(result.blocks[0]?.chunks[0]?.source, "persona");
    assert.equal(result.blocks[0]?.chunks[0]?.score, undefined);
    assert.equal(result.blocks[0]?.chunks[0]?.scores, undefined);
  });

  it("enforce: SEARCH with the first string parameter as the query; the right record on top", async () => {
    const cases = [
      ["How long does express shipping take?", "faq-shipping"],
      ["Is the motor of my blender under warranty?", "faq-warranty"],
      ["I forgot my password, how do I reset it?", "faq-password"],
      ["How many litres does the kettle hold?", "faq-kettle"],
    ] as const;
    for (const [question, expected] of cases) {
      const result = await client.retrieval.enforce({
        principal, scope, llm, target: target([FAQ_ENTRY], ["faq"]), action: "answer", params: { limit: 3, question },
      });
      assert.equal(result.query, question);
      const block = result.blocks[0];
      assert.equal(block?.use, "SEARCH");
      const top = block?.chunks[0];
      assert.equal(top?.provenance.documentId, expected, question);
      assert.equal(top?.provenance.file, "faq.jsonl");
      assert.ok(top?.scores && top.scores.dense > 0 && top.scores.fused > 0);
      assert.ok((top?.provenance.lineStart ?? 0) > 0);
      assert.ok(result.documentCount >= 1 && result.documentCount <= 3);
      assert.match(result.retrievedContext, /^### Knowledge: faq \(SEARCH\)/);
    }
    // queryParameter picks another parameter; a blank query skips SEARCH entries (benign, empty).
    const picked = await client.retrieval.enforce({
      principal, scope, llm, target: target([FAQ_ENTRY], ["faq"], "claim"), action: "answer",
      params: [{ name: "topic", value: "unrelated words" }, { name: "claim", value: "ship abroad customs" }],
    });
    assert.equal(picked.query, "ship abroad customs");
    assert.equal(picked.blocks[0]?.chunks[0]?.provenance.documentId, "faq-abroad");
    const blank = await client.retrieval.enforce({
      principal, scope, llm, target: target([FAQ_ENTRY], ["faq"]), action: "answer", params: { question: "   " },
    });
    assert.equal(blank.retrievedContext, "");
    assert.equal(blank.documentCount, 0);
  });

  it("enforce: SEQUENTIAL gives the next unit in order, per (tenant, session)", async () => {
    const sequential = { tenant: "seq-tenant", session: "a" };
    const given: string[] = [];
    for (let i = 0; i <= STEPS.length; i += 1) {
      const result = await client.retrieval.enforce({
        principal, scope: sequential, llm, target: target([STEPS_ENTRY], ["steps"]), action: "answer",
      });
      given.push(result.retrievedContext);
    }
    STEPS.forEach((step, i) => assert.ok(given[i]?.includes(`Step ${i + 1}: ${step}`), given[i]));
    assert.equal(given[STEPS.length], "", "every unit given: nothing more");
    const other = await client.retrieval.enforce({
      principal, scope: { tenant: "seq-tenant", session: "b" }, llm, target: target([STEPS_ENTRY], ["steps"]), action: "answer",
    });
    assert.match(other.retrievedContext, /Step 1: Greet the customer\./);
    assert.equal(other.blocks[0]?.use, "SEQUENTIAL");
  });

  it("requireLoaded: each source's document count, sorted by name", async () => {
    const counts = await client.retrieval.requireLoaded({
      principal, scope, target: target([POLICIES, FAQ_ENTRY, PERSONA]), names: ["policies", "faq"],
    });
    assert.deepEqual(counts, [
      { name: "faq", count: FAQ.length },
      { name: "policies", count: 2 },
    ]);
    await rejection(
      client.retrieval.requireLoaded({ principal, scope, target: target([POLICIES, PERSONA]), names: ["persona"] }),
      ValidationError, "INVALID_ARGUMENT", "INVALID_REQUEST",
    );
  });

  it("requireReady: KnowledgeNotReadyError names every empty WHEN_CONFIGURED source", async () => {
    const whenConfigured = { readiness: "WHEN_CONFIGURED" } as const;
    const entries: KnowledgeEntryInit[] = [
      { name: "zeta", type: "FILE", use: "SEARCH", path: "empty.txt", ...whenConfigured },
      { name: "alpha", type: "MEMORY", use: "SEARCH", ...whenConfigured },
      { name: "ok", type: "FILE", use: "SEARCH", path: "policies/returns.md", ...whenConfigured },
      { name: "unconfigured", type: "FILE", use: "SEARCH", ...whenConfigured },
      PERSONA,
    ];
    const error = await rejection(
      client.retrieval.requireReady({ principal, scope: { tenant: "ready-tenant", session: "s1" }, target: target(entries) }),
      KnowledgeNotReadyError, "FAILED_PRECONDITION", "KNOWLEDGE_NOT_READY",
    );
    assert.ok(error instanceof FailedPreconditionError);
    assert.equal(error.metadata.sources, "alpha,zeta");
    assert.deepEqual(error.violations.map((v) => v.field).sort(), ["knowledge[alpha]", "knowledge[zeta]"]);
    const counts = await client.retrieval.requireReady({ principal, scope, target: target(entries.slice(2)) });
    assert.deepEqual(counts, [{ name: "ok", count: 1 }]);
  });

  it("prepareChatKnowledge: DIRECT blocks and their budgets", async () => {
    const entries: KnowledgeEntryInit[] = [
      FAQ_ENTRY,
      PERSONA,
      { name: "rules", type: "INLINE", use: "DIRECT", inlineText: "Never share card numbers.", maxTokens: 50 },
    ];
    const prepared = await client.retrieval.prepareChatKnowledge({
      principal, scope, agentId: "ada", entries, llm: { model: "test-model", inputWindowTokens: 10_000 },
    });
    assert.deepEqual(
      prepared.blocks.map((b) => [b.source, b.position, b.sharedBudget]),
      [["persona", 1, true], ["rules", 2, false]],
    );
    assert.equal(prepared.inputWindowTokens, 10_000);
    assert.equal(prepared.defaultBudgetTokens, 2_500);
    assert.ok(prepared.defaultBudgetUsedTokens > 0 && prepared.defaultBudgetUsedTokens < 100);
    assert.equal(prepared.blocks[1]?.budgetTokens, 50);
    assert.match(prepared.blocks[1]?.text ?? "", /card numbers/);
    assert.equal(prepared.blocks[0]?.documentCount, 1);

    // No window, none in the table: UNKNOWN_MODEL_WINDOW. A DIRECT source over its budget: DIRECT_BUDGET_EXCEEDED.
    await rejection(
      client.retrieval.prepareChatKnowledge({ principal, scope, agentId: "ada", entries }),
      FailedPreconditionError, "FAILED_PRECONDITION", "UNKNOWN_MODEL_WINDOW",
    );
    const oversized = await rejection(
      client.retrieval.prepareChatKnowledge({
        principal, scope, agentId: "ada", llm,
        entries: [{ name: "faq", type: "FILE", use: "DIRECT", path: "faq.jsonl", maxTokens: 10 }],
      }),
      FailedPreconditionError, "FAILED_PRECONDITION", "DIRECT_BUDGET_EXCEEDED",
    );
    assert.equal(oversized.metadata.sources, "faq");
    const viaEnforce = await rejection(
      client.retrieval.enforce({
        principal, scope, llm, action: "answer",
        target: target([{ name: "faq", type: "FILE", use: "DIRECT", path: "faq.jsonl", maxTokens: 10 }], ["faq"]),
      }),
      FailedPreconditionError, "FAILED_PRECONDITION", "DIRECT_BUDGET_EXCEEDED",
    );
    assert.equal(viaEnforce.metadata.sources, "faq");
  });

  it("search: across sources, merged by score, optionally reranked", async () => {
    const result = await client.retrieval.search({
      principal, scope, target: { name: "Docs", knowledge: [FAQ_ENTRY, POLICIES] },
      query: "How many days do I have to return an item?", topK: 2,
    });
    assert.ok(result.hits.length > 0 && result.hits.length <= 4, `${result.hits.length} hits`);
    assert.deepEqual(new Set(result.hits.map((h) => h.source)), new Set(["faq", "policies"]));
    const top = result.hits[0];
    assert.ok(top?.text.includes("30 days"), top?.text);
    const scores = result.hits.map((h) => h.score ?? 0);
    assert.deepEqual(scores, [...scores].sort((a, b) => b - a));
    assert.equal(typeof result.timing.totalUs, "number");

    const reranked = await client.retrieval.search({
      principal, scope, target: { name: "Docs", knowledge: [FAQ_ENTRY] }, knowledge: ["faq"],
      query: "Does the warranty cover the motor?", topK: 2, search: { rerank: true, candidates: 6 },
    });
    assert.equal(reranked.hits[0]?.provenance.documentId, "faq-warranty");
    // The order fuses the reranker's ranks with retrieval's; the reranker's relevance stays in scores.rerank.
    assert.ok(reranked.hits.every((h) => h.scores?.rerank !== undefined && h.score !== undefined), "reranked scores");
    assert.ok(reranked.hits.every((h) => h.score !== h.scores?.rerank), "the fused order's score is not the relevance");
    // The Reranker SPI's order: the reranker's relevance, descending, is the score.
    const pure = await client.retrieval.search({
      principal, scope, target: { name: "Docs", knowledge: [FAQ_ENTRY] }, knowledge: ["faq"],
      query: "Does the warranty cover the motor?", topK: 2, search: { rerank: true, candidates: 6, rerankOrder: "RERANKER" },
    });
    assert.equal(pure.hits[0]?.provenance.documentId, "faq-warranty");
    const relevance = pure.hits.map((h) => h.scores?.rerank);
    assert.deepEqual(pure.hits.map((h) => h.score), relevance);
    assert.deepEqual(relevance, [...relevance].sort((a, b) => (b ?? 0) - (a ?? 0)));

    // A blank query is INVALID_ARGUMENT here (benign in enforce).
    const blank = await rejection(
      client.retrieval.search({ principal, scope, target: { name: "Docs", knowledge: [FAQ_ENTRY] }, query: "  " }),
      ValidationError, "INVALID_ARGUMENT", "INVALID_REQUEST",
    );
    assert.deepEqual(blank.violations.map((v) => v.field), ["query"]);
    // An unknown reranker model is NOT_FOUND / UNKNOWN_MODEL at use (ValidateConfiguration lists it as a violation).
    const unknownReranker = await rejection(
      client.retrieval.search({
        principal, scope, target: { name: "Docs", knowledge: [FAQ_ENTRY] }, query: "kettle",
        search: { rerank: true, rerankerModel: "no-such-reranker" },
      }),
      UnknownModelError, "NOT_FOUND", "UNKNOWN_MODEL",
    );
    assert.equal(unknownReranker.metadata.model, "no-such-reranker");
  });

  it("upsertDocuments / deleteDocuments: MEMORY knowledge, isolated by tenant", async () => {
    const notes: KnowledgeEntryInit = { name: "notes", type: "MEMORY", use: "SEARCH" };
    const memory = { tenant: "memory-tenant", session: "s1" };
    const documents = [
      { id: "n1", text: "The customer Bob prefers delivery on Saturdays.", metadata: { author: "ada" } },
      { id: "n2", text: "The warehouse in Leeds closes at 6pm." },
    ];
    assert.deepEqual(
      await client.retrieval.upsertDocuments({ principal, scope: memory, knowledge: "notes", documents }),
      { inserted: 2, replaced: 0, unchanged: 0, documentCount: 2 },
    );
    assert.deepEqual(
      await client.retrieval.upsertDocuments({ principal, scope: memory, knowledge: "notes", documents }),
      { inserted: 0, replaced: 0, unchanged: 2, documentCount: 2 },
    );
    const changed = await client.retrieval.upsertDocuments({
      principal, scope: memory, knowledge: "notes", documents: [{ id: "n2", text: "The warehouse in Leeds closes at 7pm." }],
    });
    assert.equal(changed.replaced, 1);

    const search = (s: ScopeInit, query: string) =>
      client.retrieval.search({ principal, scope: s, target: { name: "Notes", knowledge: [notes] }, query });
    const hits = (await search(memory, "when does Bob want his delivery?")).hits;
    assert.equal(hits[0]?.provenance.documentId, "n1");
    assert.equal(hits[0]?.source, "notes");
    // Another tenant, or another session of the same tenant, sees nothing.
    assert.deepEqual((await search({ tenant: "other-tenant", session: "s1" }, "Bob delivery")).hits, []);
    assert.deepEqual((await search({ tenant: "memory-tenant", session: "s2" }, "Bob delivery")).hits, []);
    const other = await client.retrieval.deleteDocuments({
      principal, scope: { tenant: "other-tenant", session: "s1" }, knowledge: "notes", ids: ["n1"],
    });
    assert.deepEqual(other, { deleted: 0, notFound: 1, documentCount: 0 });

    const deleted = await client.retrieval.deleteDocuments({ principal, scope: memory, knowledge: "notes", ids: ["n1", "n1", "zz"] });
    assert.deepEqual(deleted, { deleted: 1, notFound: 1, documentCount: 1 });
    const left = (await search(memory, "Bob delivery Saturdays")).hits;
    assert.deepEqual(left.map((h) => h.provenance.documentId), ["n2"]);

    const duplicate = await rejection(
      client.retrieval.upsertDocuments({ principal, scope: memory, knowledge: "notes", documents: [documents[0]!, documents[0]!] }),
      ValidationError, "INVALID_ARGUMENT", "INVALID_REQUEST",
    );
    assert.ok(duplicate.violations.length > 0);
  });

  it("refuses paths outside the knowledge roots, a missing principal and an empty tenant", async () => {
    const located: KnowledgeEntryInit = { name: "notes", type: "FILE", use: "DIRECT" };
    const inRoots = await client.retrieval.enforce({
      principal, scope, llm, action: "answer", target: target([located], ["notes"]),
      resolvedPaths: { notes: "policies/returns.md" },
    });
    assert.match(inRoots.retrievedContext, /within 30 days/);
    for (const escape of ["../x", "../../etc/passwd", "/etc/passwd", "policies/../../x"]) {
      await rejection(
        client.retrieval.enforce({
          principal, scope, llm, action: "answer", target: target([located], ["notes"]), resolvedPaths: { notes: escape },
        }),
        PermissionDeniedError, "PERMISSION_DENIED", "PATH_OUTSIDE_ROOTS",
      );
    }
    await rejection(
      client.retrieval.search({
        principal, scope, query: "secret", target: { name: "Docs", knowledge: [{ name: "x", type: "FILE", use: "SEARCH", path: "../x" }] },
      }),
      PermissionDeniedError, "PERMISSION_DENIED", "PATH_OUTSIDE_ROOTS",
    );

    const noPrincipal = { id: "" };
    await rejection(
      client.retrieval.enforce({ principal: noPrincipal, scope, llm, action: "answer", target: target([PERSONA], ["persona"]) }),
      PermissionDeniedError, "PERMISSION_DENIED", "PERMISSION_DENIED",
    );
    await rejection(
      client.retrieval.upsertDocuments({ principal: noPrincipal, scope, knowledge: "notes", documents: [{ id: "a", text: "b" }] }),
      PermissionDeniedError, "PERMISSION_DENIED", "PERMISSION_DENIED",
    );
    await rejection(
      client.retrieval.validateConfiguration({ principal, scope: { tenant: "" }, target: target([PERSONA]) }),
      ValidationError, "INVALID_ARGUMENT", "INVALID_REQUEST",
    );
    // A malformed entry at dispatch: INVALID_CONFIGURATION with one BadRequest violation per problem.
    const malformed = await rejection(
      client.retrieval.enforce({
        principal, scope, llm, action: "answer", params: { q: "returns" },
        target: target([{ ...FAQ_ENTRY, topK: 0, minScore: 7 }], ["faq"]),
      }),
      ValidationError, "INVALID_ARGUMENT", "INVALID_CONFIGURATION",
    );
    assert.ok(malformed.violations.length >= 2, JSON.stringify(malformed.violations));
    // An action the target does not declare.
    await rejection(
      client.retrieval.enforce({ principal, scope, llm, action: "nope", target: target([PERSONA], ["persona"]) }),
      ValidationError, "INVALID_ARGUMENT", "INVALID_REQUEST",
    );
  });

  it("surfaces a missing MUST_LOAD source as KnowledgeNotReadyError unless onFailure is CONTINUE", async () => {
    const missing: KnowledgeEntryInit = { name: "must", type: "FILE", use: "SEARCH", path: "not-there.md" };
    await rejection(
      client.retrieval.enforce({ principal, scope, llm, action: "answer", target: target([missing], ["must"]), params: { q: "x" } }),
      KnowledgeNotReadyError, "FAILED_PRECONDITION", "KNOWLEDGE_NOT_READY",
    );
    const tolerant = await client.retrieval.enforce({
      principal, scope, llm, action: "answer", params: { q: "x" },
      target: target([{ ...missing, onFailure: "CONTINUE" }, PERSONA], ["must", "persona"]),
    });
    assert.deepEqual(tolerant.blocks.map((b) => b.source), ["persona"]);
  });

  it("cancels through the AbortSignal", async () => {
    await assert.rejects(
      client.retrieval.search(
        { principal, scope, target: { name: "Docs", knowledge: [FAQ_ENTRY] }, query: "kettle" },
        { signal: AbortSignal.abort() },
      ),
      CancelledError,
    );
    await assert.rejects(
      client.retrieval.enforce(
        { principal, scope, llm, action: "answer", target: target([PERSONA], ["persona"]) },
        { signal: AbortSignal.abort() },
      ),
      CancelledError,
    );
  });

  it("rejects an unknown enum name before sending", async () => {
    await assert.rejects(
      client.retrieval.search({
        principal, scope, query: "q", target: { name: "Docs", knowledge: [{ name: "x", type: "FOLDER" as never, use: "SEARCH" }] },
      }),
      TypeError,
    );
  });
});
