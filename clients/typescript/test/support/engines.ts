// Node versions told honestly: what a package's lock file installs must run on the lowest Node its `engines` admits.
import { readFileSync } from "node:fs";
import * as path from "node:path";

/** The lowest Node major an `engines.node` range admits (the smallest over its `||` alternatives). */
export function lowestNodeMajor(range: string): number {
  return Math.min(...range.split("||").map((alternative) => Number(/(\d+)/.exec(alternative)?.[1] ?? 0)));
}

/**
 * The packages of `packageRoot`'s package-lock.json (dev ones included: building and testing run on that Node too)
 * whose `engines.node` excludes the lowest Node the package's own `engines.node` admits, as "name (node range)".
 */
export function lockedPackagesNeedingANewerNode(packageRoot: string): string[] {
  const own = JSON.parse(readFileSync(path.join(packageRoot, "package.json"), "utf8")) as { engines?: { node?: string } };
  const floor = lowestNodeMajor(own.engines?.node ?? "0");
  const lock = JSON.parse(readFileSync(path.join(packageRoot, "package-lock.json"), "utf8")) as {
    packages: Record<string, { engines?: { node?: string } | string[] }>;
  };
  return Object.entries(lock.packages)
    .map(([name, entry]) => [name, Array.isArray(entry.engines) ? undefined : entry.engines?.node] as const)
    .filter(([, node]) => node !== undefined && lowestNodeMajor(node) > floor)
    .map(([name, node]) => `${name} (node ${node})`);
}
