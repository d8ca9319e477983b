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
# pip builds the wheel (the build hook generates the gRPC stubs) and installs it with pinned dependencies,
# the postgres extra included (psycopg), so one image serves both store backends ([store] backend); it also
# compiles the bytecode now, since the image's root file system is read-only at run time.
"$prefix/venv/bin/pip" install --quiet --disable-pip-version-check -c "$constraints" "$source[postgres]"
RAGSIDECAR_HOME="$prefix" "$prefix/venv/bin/ragsidecar" models install
# Fails unless the installed package, its built-in defaults and the models fit together.
RAGSIDECAR_HOME="$prefix" "$prefix/venv/bin/ragsidecar" doctor > /dev/null
echo "ragsidecar installed in $prefix/venv, default models in $prefix/models"
