// What `npm pack` ships and what `npm ci` installs: the built client, the sidecar's .proto files, and dependencies
// that all run on Node 20 (the package's engines floor).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { lockedPackagesNeedingANewerNode } from "./support/engines.ts";

const PACKAGE_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const CONTRACTS = path.resolve(PACKAGE_ROOT, "../../proto/ragsidecar/v1");

describe("package", () => {
  it("ships the built client and the sidecar's .proto files", () => {
    // --ignore-scripts: `npm test` built dist/ and proto/ already (pretest), prepack would build again.
    const output = execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts"], { cwd: PACKAGE_ROOT, encoding: "utf8" });
    const files = (JSON.parse(output) as { files: { path: string }[] }[])[0]!.files.map((f) => f.path);
    const protos = readdirSync(CONTRACTS).filter((name) => name.endsWith(".proto")).map((name) => `proto/ragsidecar/v1/${name}`);
    assert.ok(protos.length >= 4, protos.join());
    assert.deepEqual(files.filter((f) => f.startsWith("proto/")).sort(), protos.sort());
    for (const proto of protos) {
      assert.equal(readFileSync(path.join(PACKAGE_ROOT, proto), "utf8"), readFileSync(path.join(CONTRACTS, path.basename(proto)), "utf8"));
    }
    assert.ok(files.includes("dist/index.js") && files.includes("dist/index.d.ts"), files.join("\n"));
    assert.deepEqual(files.filter((f) => f.startsWith("src/") || f.startsWith("test/") || f.startsWith(".snippets/")), []);
  });

  it("installs nothing that needs a newer Node than its engines admit (20)", () => {
    assert.deepEqual(lockedPackagesNeedingANewerNode(PACKAGE_ROOT), []);
  });
});
