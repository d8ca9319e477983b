// One call through the client and through each adapter, imported by package name from the tarballs of dist/npm.
import assert from "node:assert/strict";
import * as path from "node:path";
import { it } from "node:test";
import { fileURLToPath } from "node:url";
import { rerank } from "ai";
import { Document } from "@langchain/core/documents";
import { createClient } from "@ragsidecar/client";
import { ragsidecarReranking } from "@ragsidecar/ai-sdk";
import { RagSidecarRerank, RagSidecarRetriever } from "@ragsidecar/langchain";
// The repository's test sidecar (not part of the packages): a real sidecar over the FAQ knowledge files.
import { CROSS_ENCODER, FAQ, lockedPackagesNeedingANewerNode, withSidecarClient } from "../../../clients/typescript-adapters/test-support.ts";

const query = "how long does shipping take";
const here = path.dirname(fileURLToPath(import.meta.url));
const sidecar = withSidecarClient(createClient);

it("client: reranks", async () => {
  const response = await sidecar.client.reranker.rerank({ query, documents: FAQ, model: CROSS_ENCODER, topN: 1 });
  assert.equal(response.results[0]?.id, "faq-shipping");
});

it("@ragsidecar/ai-sdk: rerank() from ai", async () => {
  const { rerankedDocuments } = await rerank({ model: ragsidecarReranking(sidecar.client, CROSS_ENCODER), documents: FAQ.map((r) => r.text), query, topN: 1 });
  assert.deepEqual(rerankedDocuments, [FAQ[1]?.text]);
});

it("@ragsidecar/langchain: retriever invoke() and compressor", async () => {
  const retriever = new RagSidecarRetriever({
    client: sidecar.client,
    request: {
      principal: { id: "consumer" },
      scope: { tenant: "acme" },
      target: { name: "Docs", knowledge: [{ name: "faq", type: "FILE", use: "SEARCH", path: "faq.jsonl", topK: 2 }] },
    },
  });
  const hits = await retriever.invoke(query);
  assert.equal(hits[0]?.metadata["documentId"], "faq-shipping");
  const documents = FAQ.map((r) => new Document({ pageContent: r.text, id: r.id }));
  // No model: the sidecar's default reranker.
  const [best] = await new RagSidecarRerank({ client: sidecar.client, topN: 1 }).compressDocuments(documents, query);
  assert.equal(best?.id, "faq-shipping");
});

it("installs nothing that needs a newer Node than 20 (ai 6, not 7)", () => {
  assert.deepEqual(lockedPackagesNeedingANewerNode(here), []);
});
