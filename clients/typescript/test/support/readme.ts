// A package's README examples run as written: each ```ts block becomes a module under the package's .snippets/
// (git-ignored, never packed), all of them are type-checked with the package's own tsconfig, and each runs with tsx
// against a real sidecar and must exit by itself. Two things differ from the text: the sidecar's documented address
// (what `make run` listens on) becomes the test sidecar's, and a block that uses the `client` (and `signal`) the
// README's surrounding text defines gets them from a prelude.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { REPO_ROOT } from "./sidecar.ts";

/** A block that runs longer than this is taken for one that never exits (a timer or a connection left open). */
const HANG_MS = 120_000;

/** Where `make run` listens: the [server] host and port of config/ragsidecar.toml. */
export function documentedAddress(): string {
  const config = readFileSync(path.join(REPO_ROOT, "config", "ragsidecar.toml"), "utf8");
  const server = /^\[server\]$([\s\S]*?)(?=^\[|(?![\s\S]))/m.exec(config)?.[1] ?? "";
  const host = /^host\s*=\s*"([^"]+)"/m.exec(server)?.[1];
  const port = /^port\s*=\s*(\d+)/m.exec(server)?.[1];
  assert.ok(host && port, "config/ragsidecar.toml has no [server] host and port");
  return `${host}:${port}`;
}

/** The bodies of a README's ```ts blocks, in order. */
export function tsBlocks(readme: string): string[] {
  return [...readFileSync(readme, "utf8").matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((match) => match[1]!);
}

/** The module a block becomes: its own client pointed at `address`, or the prelude's. */
function moduleOf(block: string, index: number, address: string): string {
  const documented = JSON.stringify(documentedAddress());
  if (/\bcreateClient\(/.test(block)) {
    assert.ok(block.includes(documented), `README block ${index + 1} does not connect to ${documented}, where the sidecar listens:\n${block}`);
    return block.replaceAll(documented, JSON.stringify(address));
  }
  return [
    `import { createClient } from "@ragsidecar/client";`,
    `const client = createClient({ address: ${JSON.stringify(address)} });`,
    `const signal = AbortSignal.timeout(${HANG_MS});`,
    block,
    "client.close();",
    "",
  ].join("\n");
}

/**
 * Type-checks and runs every ```ts block of `readme` (by default `packageRoot`/README.md) against the sidecar at
 * `address`, as modules of `packageRoot`, which resolve `@ragsidecar/client` as a host's do.
 */
export function runReadmeExamples(packageRoot: string, address: string, readme = path.join(packageRoot, "README.md")): void {
  const blocks = tsBlocks(readme);
  assert.ok(blocks.length > 0, `${readme} has no ts block`);
  const dir = path.join(packageRoot, ".snippets");
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir);
  const files = blocks.map((block, index) => {
    const file = path.join(dir, `readme-${index + 1}.ts`);
    writeFileSync(file, moduleOf(block, index, address));
    return file;
  });
  writeFileSync(path.join(dir, "tsconfig.json"), JSON.stringify({ extends: "../tsconfig.json", include: ["*.ts"] }));
  const typecheck = spawnSync(path.join(packageRoot, "node_modules", ".bin", "tsc"), ["-p", dir], { cwd: packageRoot, encoding: "utf8" });
  assert.equal(typecheck.status, 0, `the README's examples do not type-check:\n${typecheck.stdout}${typecheck.stderr}`);
  files.forEach((file, index) => {
    const run = spawnSync(process.execPath, ["--import", "tsx", file], { cwd: packageRoot, encoding: "utf8", timeout: HANG_MS });
    assert.equal(run.error, undefined, `README block ${index + 1} did not exit by itself: ${run.error}\n${run.stdout}${run.stderr}`);
    assert.equal(run.status, 0, `README block ${index + 1} failed:\n${blocks[index]}\n${run.stdout}${run.stderr}`);
  });
}
