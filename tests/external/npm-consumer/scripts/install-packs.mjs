// Packs @ragsidecar/client and both adapters (`npm pack`, which builds them) and installs the tarballs here
// with `npm install --no-save <tarball>...`, as a user does before the packages are published. The tarballs
// stay out of package.json and the lock file, which pin only the published dependencies (`npm ci`).
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const clients = path.resolve(here, "../../../clients");
const packages = [path.join(clients, "typescript"), path.join(clients, "typescript-adapters/ai-sdk"), path.join(clients, "typescript-adapters/langchain")];
const npm = (args, cwd) => execFileSync("npm", args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });

const packs = mkdtempSync(path.join(tmpdir(), "ragsidecar-packs-"));
try {
  const tarballs = packages.map((folder) => {
    const [packed] = JSON.parse(npm(["pack", "--json", "--pack-destination", packs], folder));
    return path.join(packs, packed.filename);
  });
  npm(["install", "--no-save", "--no-audit", "--no-fund", ...tarballs], here);
  console.log(`installed ${tarballs.map((t) => path.basename(t)).join(", ")}`);
} finally {
  rmSync(packs, { recursive: true, force: true });
}
