// Installs the @ragsidecar tarballs `make dist` packed into dist/npm (the client and both adapters) here with
// `npm install --no-save <tarball>...`, as a user installs release artifacts taken from a team's registry or a release
// page. The tarballs stay out of package.json and the lock file, which pin only the published dependencies (`npm ci`).
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const repo = path.resolve(here, "../../..");
// One version for every artifact: the client's is the adapters' too.
const { version } = JSON.parse(readFileSync(path.join(repo, "clients/typescript/package.json"), "utf8"));
const tarballs = ["client", "ai-sdk", "langchain"].map((name) => path.join(repo, "dist/npm", `ragsidecar-${name}-${version}.tgz`));
const missing = tarballs.filter((tarball) => !existsSync(tarball));
if (missing.length > 0) {
  throw new Error(`missing ${missing.join(", ")}: run \`make dist-npm\` (or \`make dist\`) at the repository root first`);
}
execFileSync("npm", ["install", "--no-save", "--no-audit", "--no-fund", ...tarballs], { cwd: here, stdio: ["ignore", "inherit", "inherit"] });
console.log(`installed ${tarballs.map((tarball) => path.basename(tarball)).join(", ")}`);
