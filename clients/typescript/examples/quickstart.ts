// Runnable against a sidecar started with `make run` (127.0.0.1:50151):
//   cd clients/typescript && npm ci && npm run build && npx tsx examples/quickstart.ts
// RAGSIDECAR_ADDRESS and RAGSIDECAR_TOKEN override the address and supply the token.
import {
  RetrievalDuplicateError,
  UnknownModelError,
  createClient,
  defineSidecarRetrieval,
  noOpReranker,
  type OperationContext,
} from "@ragsidecar/client";

const client = createClient({
  address: process.env.RAGSIDECAR_ADDRESS ?? "127.0.0.1:50151",
  ...(process.env.RAGSIDECAR_TOKEN ? { token: process.env.RAGSIDECAR_TOKEN } : {}),
  defaultTimeoutMs: 10_000,
});

try {
  await client.awaitReady({ timeoutMs: 30_000 });
  const model = "ms-marco-MiniLM-L-12-v2";
  // supports() is synchronous: the model list is cached and refreshed in the background.
  const reranker = client.reranker.supports(model) ? client.reranker : noOpReranker();

  const documents = [
    { id: "onions", text: "Slow-cook the onions in butter until they caramelize." },
    { id: "paris", text: "Paris is the capital and largest city of France.", metadata: { lang: "en" } },
    { id: "tides", text: "Tides are caused by the pull of the moon and the sun." },
  ];
  const { results } = await reranker.rerank(
    { query: "What is the capital of France?", documents, model, topN: 2, returnDocuments: true },
    { signal: AbortSignal.timeout(5_000) },
  );
  for (const r of results) console.log(r.id, r.relevanceScore.toFixed(3), r.document?.text);

  try {
    await client.reranker.rerank({ query: "q", documents, model: "no-such-model" });
  } catch (error) {
    if (error instanceof UnknownModelError) console.log("typed error:", error.code, error.reason);
  }

  // The bounded retrieval lifecycle with an injected read (a rerank); without `search`, give `client` and
  // `request(query)` and the read is the sidecar's Search over declared knowledge.
  type Source = { sourceId: string; text: string };
  const state = { queryCount: 0, seen: new Set<string>(), sources: [] as Source[] };
  const retrieval = defineSidecarRetrieval<string, Source, { sources: Source[] }, { canRead: boolean }>({
    id: "docs-search",
    description: "Ranks the in-memory documents with the sidecar",
    prepare: (query) => query.trim(),
    assertInput(query) {
      if (!query) throw new Error("empty query");
    },
    state: () => state,
    limit: () => 2,
    authorize(_query, { app }) {
      if (!app.canRead) throw new Error("may not read the documents");
    },
    async search(query, { signal }) {
      const ranked = await client.reranker.rerank({ query, documents, topN: 1 }, { signal });
      return { sources: ranked.results.map((r) => ({ sourceId: r.id, text: documents[r.index]!.text })) };
    },
    effects: [
      {
        id: "source-count",
        description: "Adds the number of sources to the receipt",
        handle(receipt) {
          receipt.extensions.sourceCount = receipt.result.sources.length;
        },
      },
    ],
  });
  const context: OperationContext<{ canRead: boolean }> = { app: { canRead: true }, signal: new AbortController().signal };
  const receipt = await retrieval.run(" capital of France ", context);
  console.log(receipt.sequence, receipt.result.sources[0]?.sourceId, receipt.extensions);
  await retrieval.run("capital of France", context).catch((error: unknown) => {
    if (error instanceof RetrievalDuplicateError) console.log("duplicate:", error.message);
  });
} finally {
  client.close();
}
