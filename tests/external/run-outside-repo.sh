#!/usr/bin/env bash
# Runs an external consumer project (a folder beside this script) from a copy outside the repository, as a
# user's project would sit: only its tracked files are copied, and its dependencies install into the copy,
# never under tests/. The copy keeps the repository's layout through links to dist/ (the release artifacts it
# installs) and clients/ (the repository's test sidecar). Usage: run-outside-repo.sh PROJECT CMD...
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
project="$1"; shift
copy="$(mktemp -d)"
trap 'rm -rf "$copy"' EXIT
(cd "$repo" && git ls-files -z "tests/external/$project" | xargs -0 cp --parents -t "$copy")
ln -s "$repo/clients" "$copy/clients"
ln -s "$repo/dist" "$copy/dist"
cd "$copy/tests/external/$project"
"$@"
