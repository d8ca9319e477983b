// client.retrieval's MEMORY calls through the real sidecar: typed metadata, filters on search, get, list, iterate,
// delete by filter, expiry, and bad filters. Each test writes in a tenant of its own.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { ValidationError, filters, type RagSidecarClient } from "../src/index.ts";
import { Clients, servers } from "./support/fixture.ts";

const principal = { id: "agent-host" };
const target = { name: "Assistant", knowledge: [{ name: "notes", type: "MEMORY", use: "SEARCH" } as const] };

describe("retrieval: MEMORY documents", () => {
  const clients = new Clients();
  let client: RagSidecarClient;
  let tenants = 0;
  const caller = () => ({ principal, scope: { tenant: `ts-memory-${++tenants}`, session: "s1" }, knowledge: "notes" });

  before(async () => {
    const { plain } = await servers();
    client = clients.make({ address: plain.address, defaultTimeoutMs: 60_000 });
  });
  after(() => clients.closeAll());

  it("keeps typed metadata and times, and filters the search", async () => {
    const at = caller();
    const bought = new Date("2025-03-01T10:00:00.123Z");
    await client.retrieval.upsertDocuments({ ...at, documents: [
      { id: "kettle", text: "The kettle boils water for tea.", typedMetadata: { room: "kitchen", watts: 2200, smart: false, tags: ["appliance", "hot"], bought } },
      { id: "mower", text: "The lawn mower cuts the grass.", typedMetadata: { room: "garden", watts: 1200, smart: true }, metadata: { owner: "bob" } },
    ] });
    const found = await client.retrieval.getDocuments({ ...at, ids: ["kettle", "nope"] });
    assert.deepEqual(found.notFound, ["nope"]);
    assert.deepEqual(found.documents[0]!.metadata, { room: "kitchen", watts: 2200, smart: false, tags: ["appliance", "hot"], bought });
    assert.ok(found.documents[0]!.created instanceof Date && found.documents[0]!.expiresAt === undefined);

    const searched = { principal: at.principal, scope: at.scope, target };
    const hits = async (filter: Parameters<typeof filters.not>[0]) => [...new Set((await client.retrieval.search({
      ...searched, query: "household machine", topK: 5, filters: { notes: filter } })).hits.map((h) => h.provenance.documentId))];
    assert.deepEqual(await hits(filters.and(filters.eq("tags", "hot"), filters.gte("watts", 2000), filters.not(filters.eq("smart", true)))), ["kettle"]);
    assert.deepEqual(await hits(filters.or(filters.in("room", ["garden", "attic"]), filters.lt("bought", new Date(0)))), ["mower"]);
    assert.deepEqual(await hits(filters.eq("owner", "bob")), ["mower"], "string metadata filters as strings");
    const [hit] = (await client.retrieval.search({ ...searched, query: "kettle", topK: 1, filters: { notes: filters.exists("bought") } })).hits;
    assert.deepEqual(hit!.metadata["bought"], bought);
  });

  it("lists page by page, each match once, and iterates the same", async () => {
    const at = caller();
    await client.retrieval.upsertDocuments({ ...at, documents: Array.from({ length: 120 }, (_, i) => ({
      id: `d${String(i).padStart(3, "0")}`, text: `Note number ${i}.`, typedMetadata: { n: i, even: i % 2 === 0 } })) });
    const even = filters.eq("even", true);
    const paged: string[] = [];
    let pageToken = "";
    do {
      const page = await client.retrieval.listDocuments({ ...at, filter: even, pageSize: 25, pageToken });
      paged.push(...page.documents.map((d) => d.id));
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    const expected = Array.from({ length: 60 }, (_, i) => `d${String(2 * i).padStart(3, "0")}`);
    assert.deepEqual(paged, expected);
    const iterated: string[] = [];
    for await (const d of client.retrieval.iterateDocuments({ ...at, filter: even, pageSize: 7 })) iterated.push(d.id);
    assert.deepEqual(iterated, expected);
  });

  it("deletes by filter, and hides expired documents", async () => {
    const at = caller();
    await client.retrieval.upsertDocuments({ ...at, documents: [
      { id: "a", text: "Alpha.", typedMetadata: { n: 1 } }, { id: "b", text: "Beta.", typedMetadata: { n: 2 } },
      { id: "gone", text: "Expired.", expiresAt: new Date(Date.now() - 1000) },
    ] });
    assert.deepEqual((await client.retrieval.getDocuments({ ...at, ids: ["gone"] })).notFound, ["gone"]);
    assert.equal((await client.retrieval.deleteDocuments({ ...at, filter: filters.gte("n", 2) })).deleted, 1);
    assert.deepEqual((await client.retrieval.listDocuments(at)).documents.map((d) => d.id), ["a"]);
    await client.retrieval.deleteDocuments({ ...at, filter: filters.everything() });
    assert.deepEqual((await client.retrieval.listDocuments(at)).documents, []);
  });

  it("answers a bad filter with the part it names, and refuses bad values before sending", async () => {
    const at = caller();
    await assert.rejects(client.retrieval.listDocuments({ ...at, filter: filters.and(filters.eq("a", "x"), filters.lt("b", true)) }),
      (error: unknown) => error instanceof ValidationError && error.violations.some((v) => v.field.startsWith("filter.all.filters[1]")));
    await assert.rejects(client.retrieval.listDocuments({ ...at, filter: filters.eq("n", Number.NaN) }), /finite/);
    await assert.rejects(client.retrieval.upsertDocuments({ ...at, documents: [{ id: "x", text: "t", typedMetadata: { bad: {} as never } }] }),
      /typedMetadata\["bad"\]/);
  });
});
