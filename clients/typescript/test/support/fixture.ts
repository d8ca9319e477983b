// The sidecars every suite shares, started once per test process (in parallel) and stopped by main.test.ts.
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { createClient, type RagSidecarClient } from "../../src/index.ts";
import { writeKnowledge } from "./knowledge.ts";
import { startSidecar, type Sidecar } from "./sidecar.ts";

export const TOKEN = "secret";
export const CROSS_ENCODER = "ms-marco-MiniLM-L-12-v2";
export const BI_ENCODER = "bge-small-en-v1.5";

export interface Servers {
  /** No token, TCP; its knowledge root is `knowledgeRoot` (the files of support/knowledge.ts). */
  readonly plain: Sidecar;
  /** The plain sidecar's one knowledge root (paths in requests are relative to it). */
  readonly knowledgeRoot: string;
  /** RAGSIDECAR_TOKEN=secret, TCP and a Unix socket. */
  readonly secured: Sidecar;
}

let started: Promise<Servers> | undefined;
const socketDir = mkdtempSync(path.join(tmpdir(), "ragsidecar-ts-"));

export function servers(): Promise<Servers> {
  started ??= (async () => {
    const knowledgeRoot = path.join(socketDir, "knowledge");
    mkdirSync(knowledgeRoot);
    writeKnowledge(knowledgeRoot);
    const [plain, secured] = await Promise.allSettled([
      startSidecar({ dir: socketDir, knowledgeRoot }),
      startSidecar({ dir: socketDir, token: TOKEN, socketPath: path.join(socketDir, "sidecar.sock") }),
    ]);
    if (plain.status === "rejected" || secured.status === "rejected") {
      if (plain.status === "fulfilled") await plain.value.stop();
      if (secured.status === "fulfilled") await secured.value.stop();
      throw plain.status === "rejected" ? plain.reason : (secured as PromiseRejectedResult).reason;
    }
    const result = { plain: plain.value, secured: secured.value, knowledgeRoot };
    // Wait until health says SERVING and every configured model is loaded.
    await Promise.all([
      waitForModels(createClient({ address: result.plain.address })),
      waitForModels(createClient({ address: result.secured.address, token: TOKEN })),
    ]);
    return result;
  })();
  return started;
}

async function waitForModels(client: RagSidecarClient): Promise<void> {
  try {
    await client.health.waitForServing({ timeoutMs: 60_000 });
    const deadline = Date.now() + 60_000;
    for (;;) {
      const snapshot = await client.reranker.refresh();
      if (snapshot.models.every((m) => m.state === "ready")) return;
      if (snapshot.models.some((m) => m.state === "failed") || Date.now() > deadline) {
        throw new Error(`models not ready: ${JSON.stringify(snapshot.models)}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  } finally {
    client.close();
  }
}

let tlsStarted: Promise<{ sidecar: Sidecar; ca: string } | undefined> | undefined;

/** A sidecar serving TLS with a fresh self-signed certificate for 127.0.0.1; undefined without openssl. */
export function tlsServer(): Promise<{ sidecar: Sidecar; ca: string } | undefined> {
  tlsStarted ??= (async () => {
    const certFile = path.join(socketDir, "cert.pem");
    const keyFile = path.join(socketDir, "key.pem");
    const made = spawnSync("openssl", [
      "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
      "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", keyFile, "-out", certFile,
    ], { stdio: "ignore" });
    if (made.status !== 0) return undefined;
    const sidecar = await startSidecar({ dir: socketDir, tls: { certFile, keyFile } });
    return { sidecar, ca: readFileSync(certFile, "utf8") };
  })();
  return tlsStarted;
}

/** A plain sidecar started on demand on this TCP port or Unix socket (for a client made before it); the caller stops it. */
export function startLateSidecar(at: { readonly port: number } | { readonly socketPath: string }): Promise<Sidecar> {
  return startSidecar({ dir: socketDir, ...at });
}

/** A loopback port nothing listens on (yet). */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A Unix socket path in the suites' temporary folder; nothing listens there until a sidecar is started on it. */
export function socketPathFor(name: string): string {
  return path.join(socketDir, `${name}.sock`);
}

export async function stopServers(): Promise<void> {
  const [result, tls] = await Promise.all([started?.catch(() => undefined), tlsStarted?.catch(() => undefined)]);
  await Promise.all([result?.plain.stop(), result?.secured.stop(), tls?.sidecar.stop()]);
  rmSync(socketDir, { recursive: true, force: true });
}

/** Clients made by a suite, closed after it. */
export class Clients {
  private readonly all: RagSidecarClient[] = [];
  make(...args: Parameters<typeof createClient>): RagSidecarClient {
    const client = createClient(...args);
    this.all.push(client);
    return client;
  }
  closeAll(): void {
    for (const client of this.all.splice(0)) client.close();
  }
}
