// Starts the real Python sidecar for the tests: `ragsidecar serve --config <temp copy> --port 0`, reads the
// addresses it prints, and stops it (SIGTERM, then SIGKILL) at the end, even when the test process dies.
// The config copy confines the sidecar's knowledge to one root and its indexes to a temporary data_dir.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");

export interface Sidecar {
  /** "127.0.0.1:<port>". */
  readonly address: string;
  /** The Unix socket's path, when started with one. */
  readonly socketPath: string | undefined;
  /** Everything the process wrote, for failure messages. */
  output(): string;
  stop(): Promise<void>;
}

export interface StartOptions {
  /** Folder for this sidecar's config copy and data_dir (its own subfolder is made there). */
  readonly dir: string;
  /** The sidecar's one knowledge root (`[paths] knowledge_roots`); default: an empty folder under dir. */
  readonly knowledgeRoot?: string;
  readonly token?: string;
  readonly socketPath?: string;
  /** TCP port to listen on; default 0 (any free port). */
  readonly port?: number;
  /** Serve TLS with this PEM certificate and key (a [tls] table is added to the config copy). */
  readonly tls?: { readonly certFile: string; readonly keyFile: string };
  readonly startTimeoutMs?: number;
  /** Extra environment variables of the sidecar process (e.g. the OTEL_* variables). */
  readonly env?: Readonly<Record<string, string>>;
}

const children = new Set<ChildProcess>();
process.on("exit", () => {
  for (const child of children) child.kill("SIGKILL");
});

export function sidecarBinary(): string {
  const bin = process.env.RAGSIDECAR_BIN ?? path.join(REPO_ROOT, ".venv", "bin", "ragsidecar");
  if (!existsSync(bin)) {
    throw new Error(`ragsidecar not found at ${bin}: run \`make setup\` at the repository root (or set RAGSIDECAR_BIN)`);
  }
  return bin;
}

/**
 * A copy of config/ragsidecar.toml whose [paths] point at the repository's models, a data_dir of its own
 * and the given knowledge root (so indexes and MEMORY documents never land in the repository), plus an
 * optional [tls] table.
 */
export function writeConfig(dir: string, knowledgeRoot: string, tls?: StartOptions["tls"]): string {
  let text = readFileSync(path.join(REPO_ROOT, "config", "ragsidecar.toml"), "utf8");
  const paths: Record<string, string> = {
    models_dir: JSON.stringify(process.env.RAGSIDECAR_MODELS_DIR ?? path.join(REPO_ROOT, "models")),
    data_dir: JSON.stringify(path.join(dir, "data")),
    knowledge_roots: `[${JSON.stringify(knowledgeRoot)}]`,
  };
  for (const [key, value] of Object.entries(paths)) {
    const line = new RegExp(`^${key}\\s*=.*$`, "m");
    if (!line.test(text)) throw new Error(`config/ragsidecar.toml has no ${key} line under [paths]`);
    text = text.replace(line, `${key} = ${value}`);
  }
  if (tls) {
    text += `\n[tls]\ncert_file = ${JSON.stringify(tls.certFile)}\nkey_file = ${JSON.stringify(tls.keyFile)}\n`;
  }
  const file = path.join(dir, "ragsidecar.toml");
  writeFileSync(file, text);
  return file;
}

export async function startSidecar(options: StartOptions): Promise<Sidecar> {
  const dir = mkdtempSync(path.join(options.dir, "sidecar-"));
  let knowledgeRoot = options.knowledgeRoot;
  if (!knowledgeRoot) {
    knowledgeRoot = path.join(dir, "knowledge");
    mkdirSync(knowledgeRoot);
  }
  const config = writeConfig(dir, knowledgeRoot, options.tls);
  const env: NodeJS.ProcessEnv = { ...process.env, PYTHONUNBUFFERED: "1", ...options.env };
  // The config copy is authoritative for [paths].
  delete env.RAGSIDECAR_MODELS_DIR;
  delete env.RAGSIDECAR_DATA_DIR;
  const args = ["serve", "--config", config, "--port", String(options.port ?? 0), "--metrics-port", "0"];
  if (options.socketPath) args.push("--unix-socket", options.socketPath);
  delete env.RAGSIDECAR_TOKEN;
  if (options.token !== undefined) env.RAGSIDECAR_TOKEN = options.token;
  const child = spawn(sidecarBinary(), args, { env, stdio: ["ignore", "pipe", "pipe"] });
  children.add(child);
  let log = "";
  child.stdout.setEncoding("utf8");
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk: string) => (log += chunk));
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  exited.then(() => children.delete(child));

  const addresses = await new Promise<string[]>((resolve, reject) => {
    const found: string[] = [];
    let buffer = "";
    const timer = setTimeout(() => fail(new Error(`sidecar did not listen within ${options.startTimeoutMs ?? 60_000} ms\n${log}`)),
      options.startTimeoutMs ?? 60_000);
    const fail = (error: Error) => {
      clearTimeout(timer);
      child.kill("SIGKILL");
      reject(error);
    };
    child.once("exit", (code, signal) => fail(new Error(`sidecar exited (${code ?? signal}) before listening\n${log}`)));
    child.stdout.on("data", (chunk: string) => {
      log += chunk;
      buffer += chunk;
      let newline;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, newline).trim();
        buffer = buffer.slice(newline + 1);
        const listening = /^ragsidecar listening on (\S+)$/.exec(line);
        if (listening?.[1]) found.push(listening[1]);
        // Every address is printed before the "ready" line.
        if (line.startsWith("ragsidecar ready")) {
          clearTimeout(timer);
          resolve(found);
        }
      }
    });
  });
  const address = addresses.find((a) => !a.startsWith("unix:"));
  if (!address) throw new Error(`sidecar printed no TCP address\n${log}`);
  const unix = addresses.find((a) => a.startsWith("unix:"));
  return {
    address,
    socketPath: unix?.slice("unix:".length),
    output: () => log,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
      await exited;
      clearTimeout(timer);
    },
  };
}
