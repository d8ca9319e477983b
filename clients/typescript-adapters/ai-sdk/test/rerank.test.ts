// rerank() from "ai" with the sidecar's reranking model, against a real sidecar.
import assert from "node:assert/strict";
import * as path from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { rerank } from "ai";
import { createClient, UnknownModelError } from "@ragsidecar/client";
import { ragsidecarReranking } from "../src/index.ts";
import { CROSS_ENCODER, FAQ, lockedPackagesNeedingANewerNode, runReadmeExamples, withSidecarClient } from "../../test-support.ts";

const PACKAGE_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const documents = FAQ.map((record) => record.text);

describe("ragsidecarReranking in rerank()", () => {
  const sidecar = withSidecarClient(createClient);

  it("ranks the given documents by relevance, each once, cut to topN after scoring", async () => {
    const all = await rerank({ model: ragsidecarReranking(sidecar.client, CROSS_ENCODER), documents, query: "how long does shipping take" });
    assert.equal(all.ranking.length, documents.length);
    assert.deepEqual(new Set(all.ranking.map((r) => r.originalIndex)).size, documents.length);
    assert.equal(all.rerankedDocuments[0], FAQ[1]!.text);
    const scores = all.ranking.map((r) => r.score);
    assert.deepEqual(scores, [...scores].sort((a, b) => b - a));
    for (const r of all.ranking) assert.equal(r.document, documents[r.originalIndex]);

    const top = await rerank({ model: ragsidecarReranking(sidecar.client, CROSS_ENCODER), documents, query: "how long does shipping take", topN: 2 });
    // topN keeps the head of the full ranking: the cut comes after scoring every document.
    assert.deepEqual(top.ranking.map((r) => r.originalIndex), all.ranking.slice(0, 2).map((r) => r.originalIndex));
    assert.equal(top.response.modelId, CROSS_ENCODER);
  });

  it("scores object documents as their JSON text", async () => {
    const result = await rerank({ model: ragsidecarReranking(sidecar.client.reranker, CROSS_ENCODER), documents: FAQ, query: "reset my password", topN: 1 });
    assert.deepEqual(result.rerankedDocuments, [FAQ[4]]);
  });

  it("fails clearly for a model the sidecar does not serve", async () => {
    await assert.rejects(
      rerank({ model: ragsidecarReranking(sidecar.client, "no-such-model"), documents, query: "shipping", maxRetries: 0 }),
      (error: unknown) => error instanceof UnknownModelError && /no-such-model/.test(error.message),
    );
    assert.throws(() => ragsidecarReranking(sidecar.client, " "), /modelId must name a reranker model/);
  });

  it("reports an empty ranking of a non-empty input, and headers, as warnings the AI SDK logs", async () => {
    const logged: unknown[] = [];
    globalThis.AI_SDK_LOG_WARNINGS = (options) => logged.push(...options.warnings);
    try {
      const result = await rerank({
        model: ragsidecarReranking(sidecar.client, CROSS_ENCODER), documents, query: "shipping",
        providerOptions: { ragsidecar: { minRelevanceScore: 1 } }, headers: { "x-trace": "1" },
      });
      assert.deepEqual(result.ranking, []);
      assert.deepEqual(logged, [
        { type: "other", message: "no result for 6 documents (minRelevanceScore or topN 0)" },
        { type: "unsupported", feature: "headers", details: "the sidecar is called over gRPC; configure the client instead" },
      ]);
    } finally {
      globalThis.AI_SDK_LOG_WARNINGS = undefined;
    }
  });

  it("runs the README's example as written", () => {
    runReadmeExamples(PACKAGE_ROOT, sidecar.client.target);
  });

  it("installs nothing that needs a newer Node than its engines admit (20: ai 6, not 7)", () => {
    assert.deepEqual(lockedPackagesNeedingANewerNode(PACKAGE_ROOT), []);
  });
});
