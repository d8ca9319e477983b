#!/usr/bin/env bash
# Installs the sidecar as its container image holds it. The Containerfile runs this script and nothing else,
# and tests/e2e/test_install.py runs it too: the image's steps are tested without a container engine.
#
# usage: install.sh SOURCE PREFIX
#   SOURCE  the project: a checkout, or an sdist (.tar.gz) built from one
#   PREFIX  gets venv/ (the package, dependencies pinned by constraints.txt), models/ (the default models)
#           and .cache/ (the models' download cache, which the image leaves behind)
# Environment: PYTHON (default python3); CONSTRAINTS (default: the constraints.txt of the checkout holding
# this script).
set -euo pipefail

source=$1
prefix=$2
constraints=${CONSTRAINTS:-$(cd "$(dirname "$0")/../.." && pwd)/constraints.txt}

"${PYTHON:-python3}" -m venv "$prefix/venv"
# uv (pinned by the constraints too) installs what pip would in a third of the time; it runs from a folder of its
# own, removed on exit, so the image never holds it. It takes its index from UV_INDEX_URL, or as pip would from
# PIP_INDEX_URL.
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"$prefix/venv/bin/pip" install --quiet --disable-pip-version-check --target "$tools" -c "$constraints" uv
index=()
if [ -n "${PIP_INDEX_URL:-}" ] && [ -z "${UV_INDEX_URL:-}" ]; then index=(--index-url "$PIP_INDEX_URL"); fi
# It builds the wheel (the build hook generates the gRPC stubs) and installs it with pinned dependencies, the
# postgres extra included (psycopg), so one image serves both store backends ([store] backend); it also compiles
# the bytecode now, since the image's root file system is read-only at run time.
"$tools/bin/uv" pip install --quiet --python "$prefix/venv/bin/python" --compile-bytecode -c "$constraints" \
  "${index[@]}" "$source[postgres]"
RAGSIDECAR_HOME="$prefix" "$prefix/venv/bin/ragsidecar" models install
# Fails unless the installed package, its built-in defaults and the models fit together.
RAGSIDECAR_HOME="$prefix" "$prefix/venv/bin/ragsidecar" doctor > /dev/null
echo "ragsidecar installed in $prefix/venv, default models in $prefix/models"
