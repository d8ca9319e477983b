// client.retrieval.search's rerank depth, grouping by document and retrieval mode, through the real sidecar, on
// MEMORY documents written here: long ones (several chunks each) on distinct topics and a short one holding a
// word no model has seen.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { ValidationError, type KnowledgeEntryInit, type RagSidecarClient, type SearchOptionsInit } from "../src/index.ts";
import { Clients, servers } from "./support/fixture.ts";
import { rejection } from "./support/assertions.ts";

const principal = { id: "agent-host" };
const scope = { tenant: "acme", session: "search-options" };
const NOTES: KnowledgeEntryInit = { name: "long-notes", type: "MEMORY", use: "SEARCH" };
const RARE = "zorblaxite";
const TOPICS: Record<string, string[]> = {
  volcanoes: ["magma", "eruption", "lava", "crater", "basalt", "caldera"],
  baking: ["dough", "yeast", "oven", "flour", "crust", "sourdough"],
  sailing: ["sail", "mast", "hull", "keel", "harbour", "rudder"],
};

/** About 600 words on one topic: several chunks of one document. */
function longText(topic: string, words: string[]): string {
  const sentences = Array.from({ length: 50 }, (_, i) =>
    `The ${words[i % words.length]} and the ${words[(i * 5 + 1) % words.length]} matter in ${topic}, ` +
    `where each ${words[(i * 3 + 2) % words.length]} meets a ${words[(i + 4) % words.length]}.`);
  return sentences.join(" ");
}

describe("search options", () => {
  const clients = new Clients();
  let client: RagSidecarClient;

  async function search(query: string, topK: number, options: SearchOptionsInit) {
    return client.retrieval.search({ principal, scope, target: { name: "Notes", knowledge: [NOTES] }, query, topK, search: options });
  }

  before(async () => {
    const { plain } = await servers();
    client = clients.make({ address: plain.address, defaultTimeoutMs: 120_000 });
    const documents = Object.entries(TOPICS).map(([topic, words]) => ({ id: topic, text: longText(topic, words) }));
    documents.push({ id: "minerals", text: `A mineral named ${RARE} was catalogued in a quarry ledger.` });
    await client.retrieval.upsertDocuments({ principal, scope, knowledge: "long-notes", documents });
  });
  after(() => clients.closeAll());

  const QUERY = "how does magma reach the crater in an eruption";

  it("rerankDepth: the reranked head, then the rest in retrieval order", async () => {
    const retrieval = (await search(QUERY, 100, {})).hits.map((h) => h.chunkId);
    assert.ok(retrieval.length > 3, `${retrieval.length} chunks`);
    const reranked = await search(QUERY, 100, { rerank: true, rerankDepth: 3 });
    assert.equal(reranked.usage.pairs, 3);
    assert.deepEqual(new Set(reranked.hits.slice(0, 3).map((h) => h.chunkId)), new Set(retrieval.slice(0, 3)));
    assert.deepEqual(reranked.hits.slice(3).map((h) => h.chunkId), retrieval.slice(3));
    assert.ok(reranked.hits.slice(3).every((h) => h.scores?.rerank === undefined), "no relevance past the depth");
    await rejection(search(QUERY, 10, { rerank: true, rerankDepth: 3, rerankOrder: "RERANKER" }),
      ValidationError, "INVALID_ARGUMENT", "INVALID_CONFIGURATION");
  });

  it("groupByDocument: each document's best chunk, topK counting documents", async () => {
    const chunks = (await search(QUERY, 100, {})).hits;
    const documents = [...new Set(chunks.map((h) => h.provenance.documentId))];
    const grouped = await search(QUERY, 3, { groupByDocument: true });
    assert.deepEqual(grouped.hits.map((h) => h.provenance.documentId), documents.slice(0, 3));
    assert.deepEqual(grouped.hits.map((h) => h.chunkId),
      documents.slice(0, 3).map((d) => chunks.find((h) => h.provenance.documentId === d)?.chunkId));
  });

  it("retrievalMode: lexical finds the exact rare word, dense has no BM25 scores", async () => {
    const lexical = await search(`${RARE} ledger`, 10, { retrievalMode: "LEXICAL" });
    assert.deepEqual(lexical.hits.map((h) => h.provenance.documentId), ["minerals"]);
    assert.equal(typeof lexical.hits[0]?.scores?.bm25, "number");
    const dense = await search(`${RARE} ledger`, 10, { retrievalMode: "DENSE" });
    assert.ok(dense.hits.length > 1 && dense.hits.every((h) => h.scores?.bm25 === undefined), "dense-only hits");
    await assert.rejects(search(QUERY, 3, { retrievalMode: "FUZZY" as never }), TypeError);
    await rejection(search(QUERY, 3, { retrievalMode: 42 as never }), ValidationError, "INVALID_ARGUMENT", "INVALID_REQUEST");
  });
});
