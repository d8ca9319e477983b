// SidecarVectorStore through LangChain.js's own VectorStore API, against a real sidecar and its real embedder.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Document } from "@langchain/core/documents";
import { createClient } from "@ragsidecar/client";
import { SidecarVectorStore } from "../src/index.ts";
import { withSidecarClient } from "../../test-support.ts";

const KETTLE = Array(60).fill("The kettle boils water for tea in the kitchen within three minutes.").join(" ");
const household = [
  new Document({ id: "kettle", pageContent: KETTLE, metadata: { room: "kitchen", watts: 2200, smart: false, tags: ["appliance", "hot"], bought: new Date("2025-03-01T10:00:00Z") } }),
  new Document({ id: "toaster", pageContent: "The toaster browns four slices of bread for breakfast.", metadata: { room: "kitchen", watts: 900, smart: true, tags: ["appliance"] } }),
  new Document({ id: "mower", pageContent: "The lawn mower cuts the grass in the garden on Saturdays.", metadata: { room: "garden", watts: 1200, smart: false } }),
];

describe("SidecarVectorStore", () => {
  const sidecar = withSidecarClient(createClient);
  let tenants = 0;
  const store = (options: { ttlMs?: number } = {}) => new SidecarVectorStore({
    client: sidecar.client, knowledge: "notes", principal: { id: "agent-host" }, scope: { tenant: `lcjs-store-${++tenants}`, session: "s1" }, ...options,
  });
  const ids = (documents: { id?: string | undefined }[]) => documents.map((d) => d.id).sort();

  it("finds each document once, whole, with its id, typed metadata and similarity", async () => {
    const memory = store();
    assert.deepEqual(await memory.addDocuments(household), ["kettle", "toaster", "mower"]);
    const scored = await memory.similaritySearchWithScore("boil water for tea", 3);
    assert.equal(scored.length, 3);
    const [kettle, score] = scored[0]!;
    assert.equal(kettle.id, "kettle");
    assert.equal(kettle.pageContent, KETTLE, "a document split into chunks comes back once, whole");
    assert.deepEqual(kettle.metadata, household[0]!.metadata);
    assert.ok(score > 0.3 && score <= 1 && score >= scored[1]![1], String(score));
  });

  it("translates Mongo-style filters, in similaritySearch and asRetriever", async () => {
    const memory = store();
    await memory.addDocuments(household);
    const search = async (filter: Record<string, unknown>) => ids(await memory.similaritySearch("household appliance", 5, filter));
    assert.deepEqual(await search({ room: "kitchen" }), ["kettle", "toaster"]);
    assert.deepEqual(await search({ room: "kitchen", watts: { $gte: 1000 } }), ["kettle"]);
    assert.deepEqual(await search({ $or: [{ smart: true }, { room: { $eq: "garden" } }] }), ["mower", "toaster"]);
    assert.deepEqual(await search({ tags: { $in: ["appliance", "tool"] } }), ["kettle", "toaster"]);
    assert.deepEqual(await search({ tags: { $nin: ["appliance"] } }), ["mower"]);
    assert.deepEqual(await search({ $not: { room: "kitchen" } }), ["mower"]);
    assert.deepEqual(await search({ watts: { $lt: 1000, $gt: 500 } }), ["toaster"]);
    assert.deepEqual(await search({ tags: { $exists: false } }), ["mower"]);
    assert.deepEqual(await search({ bought: { $gte: new Date("2025-01-01T00:00:00Z") } }), ["kettle"]);
    assert.deepEqual(await search({ $id: { $ne: "kettle" }, room: "kitchen" }), ["toaster"]);

    const retriever = memory.asRetriever({ k: 5, filter: { room: "garden" } });
    assert.deepEqual(ids(await retriever.invoke("grass")), ["mower"]);
  });

  it("refuses what cannot be translated or stored, clearly", async () => {
    const memory = store();
    await assert.rejects(memory.similaritySearch("x", 3, { room: { $regex: "^kit" } }), /cannot translate.*\$regex/);
    await assert.rejects(memory.similaritySearch("x", 3, { room: { nested: 1 } }), /cannot translate.*filter\.room/);
    await assert.rejects(memory.addDocuments([new Document({ pageContent: "t", metadata: { loc: { lines: { from: 1, to: 2 } } } })]), /metadata "loc"/);
    await assert.rejects(memory.similaritySearchVectorWithScore(), /searches by the query's text/);
  });

  it("deletes by ids and by filter", async () => {
    const memory = store();
    await memory.addDocuments(household);
    const all = async () => ids(await memory.similaritySearch("appliance", 10));
    await memory.delete({ ids: ["toaster"] });
    assert.deepEqual(await all(), ["kettle", "mower"]);
    await memory.delete({ filter: { room: "garden" } });
    assert.deepEqual(await all(), ["kettle"]);
  });

  it("hides expired documents", async () => {
    const memory = store({ ttlMs: 1 });
    await memory.addDocuments([new Document({ id: "brief", pageContent: "The kettle boils water." })]);
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.deepEqual(await memory.similaritySearch("kettle", 3), []);
  });
});
