// The LangChain adapters inside LangChain's own runnables, against a real sidecar.
import assert from "node:assert/strict";
import * as path from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { Document } from "@langchain/core/documents";
import { RunnableLambda } from "@langchain/core/runnables";
import { createClient, UnknownModelError } from "@ragsidecar/client";
import { RagSidecarRerank, RagSidecarRetriever } from "../src/index.ts";
import { CROSS_ENCODER, FAQ, lockedPackagesNeedingANewerNode, runReadmeExamples, withSidecarClient } from "../../test-support.ts";

const PACKAGE_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

const request = {
  principal: { id: "agent-host" },
  scope: { tenant: "acme", session: "s1" },
  target: { name: "Docs", knowledge: [{ name: "faq", type: "FILE", use: "SEARCH", path: "faq.jsonl", topK: 3 } as const] },
};
const faqDocuments = FAQ.map((record) => new Document({ pageContent: record.text, id: record.id, metadata: { key: record.id } }));

describe("RagSidecarRetriever and RagSidecarRerank", () => {
  const sidecar = withSidecarClient(createClient);

  it("retrieves the declared knowledge through invoke(), best hit first", async () => {
    const retriever = new RagSidecarRetriever({ client: sidecar.client, request });
    const documents = await retriever.invoke("how do I reset my password");
    assert.ok(documents.length > 0 && documents.length <= 3);
    assert.equal(documents[0]!.pageContent, FAQ[4]!.text);
    assert.equal(documents[0]!.metadata["source"], "faq");
    assert.equal(documents[0]!.metadata["documentId"], "faq-password");
    assert.equal(typeof documents[0]!.id, "string");
  });

  it("reranks the given documents, each once, cut to topN after scoring", async () => {
    const all = await new RagSidecarRerank({ client: sidecar.client, model: CROSS_ENCODER }).compressDocuments(faqDocuments, "how long does shipping take");
    assert.equal(all.length, FAQ.length);
    assert.equal(new Set(all.map((d) => d.id)).size, FAQ.length);
    assert.equal(all[0]!.id, "faq-shipping");
    assert.equal(all[0]!.metadata["key"], "faq-shipping");
    const scores = all.map((d) => d.metadata["relevanceScore"] as number);
    assert.deepEqual(scores, [...scores].sort((a, b) => b - a));

    const top = await new RagSidecarRerank({ client: sidecar.client.reranker, model: CROSS_ENCODER, topN: 2 }).compressDocuments(
      faqDocuments, "how long does shipping take");
    assert.deepEqual(top.map((d) => d.id), all.slice(0, 2).map((d) => d.id));
  });

  it("reranks with the sidecar's default model when none is named", async () => {
    const byDefault = await new RagSidecarRerank({ client: sidecar.client, topN: 1 }).compressDocuments(faqDocuments, "how long does shipping take");
    assert.equal(byDefault[0]!.id, "faq-shipping");
    const named = await new RagSidecarRerank({ client: sidecar.client, model: CROSS_ENCODER, topN: 1 }).compressDocuments(faqDocuments, "how long does shipping take");
    assert.equal(byDefault[0]!.metadata["relevanceScore"], named[0]!.metadata["relevanceScore"], "the default model is the configured cross-encoder");
  });

  it("retrieves then reranks in one runnable chain", async () => {
    const retriever = new RagSidecarRetriever({ client: sidecar.client, request: { ...request, topK: 6 } });
    const rerank = new RagSidecarRerank({ client: sidecar.client, model: CROSS_ENCODER, topN: 1 });
    const chain = RunnableLambda.from(async (query: string) => rerank.compressDocuments(await retriever.invoke(query), query));
    const [best, ...rest] = await chain.invoke("can I return an item for a refund");
    assert.deepEqual(rest, []);
    assert.equal(best!.metadata["documentId"], "faq-returns");
    assert.equal(typeof best!.metadata["relevanceScore"], "number");
  });

  it("fails clearly for a model the sidecar does not serve, and reports an empty result", async () => {
    await assert.rejects(
      new RagSidecarRerank({ client: sidecar.client, model: "no-such-model" }).compressDocuments(faqDocuments, "shipping"),
      (error: unknown) => error instanceof UnknownModelError && /no-such-model/.test(error.message),
    );
    assert.throws(() => new RagSidecarRerank({ client: sidecar.client, model: "" }), /model must name a reranker model/);
    const warnings: string[] = [];
    const strict = new RagSidecarRerank({ client: sidecar.client, model: CROSS_ENCODER, minRelevanceScore: 1, warn: (m) => warnings.push(m) });
    assert.deepEqual(await strict.compressDocuments(faqDocuments, "shipping"), []);
    assert.equal(warnings.length, 1);
    assert.match(warnings[0]!, /no result for 6 documents/);
  });

  it("runs the README's example as written", () => {
    runReadmeExamples(PACKAGE_ROOT, sidecar.client.target);
  });

  it("installs nothing that needs a newer Node than its engines admit (20)", () => {
    assert.deepEqual(lockedPackagesNeedingANewerNode(PACKAGE_ROOT), []);
  });
});
