// The README's TypeScript examples, and the repository README's, type-checked and run as written (support/readme.ts)
// against a sidecar of their own over the knowledge files they name; a file of its own, so that main.test.ts's shared
// sidecars keep their pace.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { writeKnowledge } from "./support/knowledge.ts";
import { runReadmeExamples } from "./support/readme.ts";
import { REPO_ROOT, startSidecar, type Sidecar } from "./support/sidecar.ts";

const PACKAGE_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

describe("README", () => {
  const dir = mkdtempSync(path.join(tmpdir(), "ragsidecar-readme-"));
  let sidecar: Sidecar | undefined;
  before(async () => {
    const knowledgeRoot = path.join(dir, "knowledge");
    mkdirSync(knowledgeRoot);
    writeKnowledge(knowledgeRoot);
    sidecar = await startSidecar({ dir, knowledgeRoot });
  });
  after(async () => {
    await sidecar?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("type-checks and runs every TypeScript example as written", () => {
    runReadmeExamples(PACKAGE_ROOT, sidecar!.address);
  });

  it("type-checks and runs the repository README's TypeScript example as written", () => {
    runReadmeExamples(PACKAGE_ROOT, sidecar!.address, path.join(REPO_ROOT, "README.md"));
  });
});
