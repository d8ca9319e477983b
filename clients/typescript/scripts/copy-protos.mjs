// Copies the sidecar's contracts (../../proto/ragsidecar) into proto/, which the npm package ships (package.json
// "files"), so that a consumer can generate code for another language, or read the wire format, from the exact
// .proto files this client was built from. proto/ is a build output (git-ignored).
import { cpSync, rmSync, statSync } from "node:fs";

const source = new URL("../../../proto/ragsidecar", import.meta.url);
const shipped = new URL("../proto", import.meta.url);
rmSync(shipped, { recursive: true, force: true });
cpSync(source, new URL("ragsidecar", `${shipped.href}/`), {
  recursive: true,
  filter: (path) => statSync(path).isDirectory() || path.endsWith(".proto"),
});
