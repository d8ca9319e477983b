// One real sidecar for an adapter's tests, reusing the client's test support (no copy): the knowledge files
// of support/knowledge.ts under a temporary root, stopped and removed by `stop()`.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { after, before } from "node:test";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { writeKnowledge } from "../typescript/test/support/knowledge.ts";
import { startSidecar } from "../typescript/test/support/sidecar.ts";

export { FAQ } from "../typescript/test/support/knowledge.ts";
export { lockedPackagesNeedingANewerNode } from "../typescript/test/support/engines.ts";
export { runReadmeExamples } from "../typescript/test/support/readme.ts";
/** The sidecar's default reranker (config/ragsidecar.toml). */
export const CROSS_ENCODER = "ms-marco-MiniLM-L-12-v2";

export interface TestSidecar {
  /** "127.0.0.1:<port>". */
  readonly address: string;
  stop(): Promise<void>;
}

export async function startKnowledgeSidecar(): Promise<TestSidecar> {
  const dir = mkdtempSync(path.join(tmpdir(), "ragsidecar-adapter-"));
  const knowledgeRoot = path.join(dir, "knowledge");
  mkdirSync(knowledgeRoot);
  writeKnowledge(knowledgeRoot);
  const sidecar = await startSidecar({ dir, knowledgeRoot });
  return {
    address: sidecar.address,
    async stop() {
      await sidecar.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export interface HttpSidecar extends TestSidecar {
  /** The HTTP API's base URL, "http://127.0.0.1:<port>". */
  readonly httpUrl: string;
}

/** A sidecar that also serves the HTTP API, for tests of the frameworks' own Cohere and OpenAI clients. */
export async function startHttpSidecar(): Promise<HttpSidecar> {
  const port = await freePort();
  const dir = mkdtempSync(path.join(tmpdir(), "ragsidecar-http-"));
  const sidecar = await startSidecar({ dir, env: { RAGSIDECAR_HTTP_PORT: String(port) } });
  return {
    address: sidecar.address,
    httpUrl: `http://127.0.0.1:${port}`,
    async stop() {
      await sidecar.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

/** The client of the package under test, as much of it as the helper needs (it cannot import the package). */
interface ReadyClient {
  awaitReady(options: { readonly timeoutMs: number }): Promise<unknown>;
  close(): void;
}

/**
 * Registers before/after hooks on the calling test file: a sidecar and a client made by `create` on it, ready
 * for reranking, both stopped after the file's tests. `client` is set once the before hook ran.
 */
export function withSidecarClient<Client extends ReadyClient>(create: (options: { address: string }) => Client): { client: Client } {
  let sidecar: TestSidecar | undefined;
  const context = {} as { client: Client };
  before(async () => {
    sidecar = await startKnowledgeSidecar();
    context.client = create({ address: sidecar.address });
    await context.client.awaitReady({ timeoutMs: 90_000 });
  });
  after(async () => {
    context.client?.close();
    await sidecar?.stop();
  });
  return context;
}
