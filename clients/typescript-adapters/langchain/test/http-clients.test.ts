// LangChain.js's own OpenAIEmbeddings, given only the sidecar's HTTP base URL and a dummy key, against a real
// sidecar: docs/http.md's table.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { OpenAIEmbeddings } from "@langchain/openai";
import { type HttpSidecar, startHttpSidecar } from "../../test-support.ts";

const documents = ["Berlin is the capital of Germany.", "Paris is the capital and largest city of France."];

describe("LangChain.js OpenAIEmbeddings given the sidecar's base URL", () => {
  let sidecar: HttpSidecar;
  before(async () => {
    sidecar = await startHttpSidecar();
  });
  after(async () => {
    await sidecar?.stop();
  });

  for (const suffix of ["", "/v1"]) {
    it(`embeds documents and a query with the base URL${suffix ? ` and ${suffix}` : ""}`, async () => {
      const embeddings = new OpenAIEmbeddings({
        model: "bge-small-en-v1.5",
        apiKey: "dummy",
        configuration: { baseURL: sidecar.httpUrl + suffix },
      });
      const vectors = await embeddings.embedDocuments(documents);
      assert.equal(vectors.length, 2);
      assert.equal(vectors[0]!.length, 384);
      assert.ok(Math.abs(Math.hypot(...vectors[0]!) - 1) < 1e-3);
      const query = await embeddings.embedQuery("What is the capital of France?");
      assert.equal(query.length, 384);
    });
  }
});
