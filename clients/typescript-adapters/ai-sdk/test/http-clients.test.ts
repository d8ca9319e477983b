// The AI SDK's own Cohere and OpenAI providers and the cohere-ai SDK, given only the sidecar's HTTP base URL (the
// bare one where the issue found they needed more) and a dummy key, against a real sidecar: docs/http.md's table.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { createCohere } from "@ai-sdk/cohere";
import { createOpenAI } from "@ai-sdk/openai";
import { embedMany, rerank } from "ai";
import { CohereClientV2 } from "cohere-ai";
import { CROSS_ENCODER, type HttpSidecar, startHttpSidecar } from "../../test-support.ts";

const query = "What is the capital of France?";
const documents = ["Berlin is the capital of Germany.", "Paris is the capital and largest city of France."];

describe("HTTP clients given the sidecar's base URL", () => {
  let sidecar: HttpSidecar;
  before(async () => {
    sidecar = await startHttpSidecar();
  });
  after(async () => {
    await sidecar?.stop();
  });

  it("@ai-sdk/cohere reranks with the bare base URL", async () => {
    const cohere = createCohere({ baseURL: sidecar.httpUrl, apiKey: "dummy" });
    const result = await rerank({ model: cohere.reranking(CROSS_ENCODER), documents, query });
    assert.deepEqual(result.ranking.map((r) => r.originalIndex), [1, 0]);
    assert.ok(result.ranking[0]!.score > 0.5 && result.ranking[1]!.score < 0.5);
  });

  for (const suffix of ["", "/v1"]) {
    it(`@ai-sdk/openai embeds with the base URL${suffix ? ` and ${suffix}` : ""}`, async () => {
      const openai = createOpenAI({ baseURL: sidecar.httpUrl + suffix, apiKey: "dummy" });
      const { embeddings } = await embedMany({ model: openai.embedding("bge-small-en-v1.5"), values: documents });
      assert.equal(embeddings.length, 2);
      assert.equal(embeddings[0]!.length, 384);
      assert.ok(Math.abs(Math.hypot(...embeddings[0]!) - 1) < 1e-3);
    });
  }

  it("cohere-ai's CohereClientV2 reranks and reads the billed search units", async () => {
    const client = new CohereClientV2({ token: "dummy", environment: sidecar.httpUrl });
    const response = await client.rerank({ model: CROSS_ENCODER, query, documents });
    assert.deepEqual(response.results.map((r) => r.index), [1, 0]);
    assert.equal(response.meta?.billedUnits?.searchUnits, 1);
  });
});
