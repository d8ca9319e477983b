# One-command set-up: `make run` serves, `make test` runs every test suite. Both create what they need.
# `make dist` builds every release artifact into dist/ (see docs/releasing.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CONFIG ?= config/ragsidecar.toml
PROTOS := $(wildcard proto/ragsidecar/v1/*.proto)
GEN_STAMP := server/src/ragsidecar/v1/.generated
BUF := clients/typescript/node_modules/.bin/buf
SOAK_MINUTES ?= 30
# The one version of every artifact (docs/releasing.md).
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' server/src/ragsidecar/__init__.py)
# protobuf-java lines the Java client is proven on from dist/: the 3.25.x it is compiled against, the oldest and
# the newest 4.x it supports (the client's own suite runs on the last one too).
PROTOBUF_LINES := 3.25.8 4.28.3 4.36.2
JAVA_MODULES := clients/java clients/java/adapters/langchain4j clients/java/adapters/spring-ai
NPM_ADAPTERS := clients/typescript-adapters/ai-sdk clients/typescript-adapters/langchain
NPM_CI := npm ci --no-audit --no-fund --silent

.PHONY: setup run test test-fast test-python test-java test-typescript lint models bench soak doctor dist dist-python dist-java dist-npm clean

# The package's own bytecode too (only what changed since): an editable install leaves it out, and every sidecar
# start would compile its ~100 modules again (0.2 s of each start).
setup: $(VENV)/.installed $(GEN_STAMP) models
	$(PY) -m compileall -q server/src

# uv installs what pip would, at the same pins (constraints.txt), in seconds where pip takes a minute. It compiles
# the bytecode as it installs (pip does; uv only when asked): where PYTHONDONTWRITEBYTECODE is set, as on these
# machines, every Python start would otherwise compile numpy, grpc and the rest again (0.3 s of each sidecar start).
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt uv
	$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -c constraints.txt -e '.[dev]'
	touch $@

$(GEN_STAMP): $(PROTOS) $(VENV)/.installed
	rm -rf server/src/ragsidecar/v1
	$(PY) -m grpc_tools.protoc -I proto --python_out=server/src --grpc_python_out=server/src \
		--pyi_out=server/src $(PROTOS)
	echo '"""Generated from proto/ragsidecar/v1 at build time; never edited."""' > server/src/ragsidecar/v1/__init__.py
	touch $@

# The checkout is the ragsidecar home here: models in ./models, their download cache in ./.cache.
models: $(VENV)/.installed
	RAGSIDECAR_HOME=$(CURDIR) $(VENV)/bin/ragsidecar models install

run: setup
	$(VENV)/bin/ragsidecar serve --config $(CONFIG)

doctor: setup
	$(VENV)/bin/ragsidecar doctor --config $(CONFIG)

clients/typescript/node_modules/.installed: clients/typescript/package.json clients/typescript/package-lock.json
	cd clients/typescript && $(NPM_CI)
	touch $@

clients/typescript-adapters/%/node_modules/.installed: clients/typescript-adapters/%/package.json \
		clients/typescript-adapters/%/package-lock.json
	cd clients/typescript-adapters/$* && $(NPM_CI)
	touch $@

# The proto (buf), then the Python code: ruff's format check and lint over the repository, mypy over server/src (it
# reads the generated stubs), and the import rules of pyproject.toml [tool.importlinter] (lint-imports). Every finding
# fails it; `make test` runs it first.
lint: $(VENV)/.installed $(GEN_STAMP) clients/typescript/node_modules/.installed
	$(BUF) lint
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# Every Python test, spread over one xdist worker per core, a file at a time (each worker has its own session
# fixtures, PostgreSQL and shared sidecars; a file's module-scoped sidecars start once). PYTEST_WORKERS=0 runs them
# in this process.
PYTEST_WORKERS ?= auto
test-python: setup
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

# The unit layer (tests/unit: every pure test, in process, no server, no models), in seconds; `make test` runs
# every layer (tests/unit, tests/contract, tests/server, tests/e2e).
test-fast: setup
	$(PY) -m pytest -q tests/unit

# The clients' own suites and the external consumers test the clients, not the models: their sidecars run the tests'
# tiny models (tests/tiny_models.py, built once), through the $RAGSIDECAR_MODELS_DIR override (on a suite's own
# commands only: `models` installs into that folder when it is set). The adapters' suites keep the packaged models:
# they hold the frameworks' similarity thresholds and README examples to real scores.
TINY_MODELS = RAGSIDECAR_MODELS_DIR=$$($(CURDIR)/$(PY) $(CURDIR)/tests/tiny_models.py)
# dist-npm built every package (its prepack): a suite type-checks its sources and tests, then runs them without
# building the package again (`npm test` alone does both).
NPM_TYPECHECK = node_modules/.bin/tsc -p tsconfig.json

# The client's suite on the protobuf-java it is compiled against and, with the same classes, on the newest 4.x (all
# but its four channel-only tests: pom.xml, profile protobuf4); the
# adapters' suites; then the external consumer on each protobuf line, with the artifacts taken from dist/maven.
test-java: setup dist-java
	cd clients/java && $(TINY_MODELS) mvn -q -B test
	cd clients/java && $(TINY_MODELS) mvn -q -B test -Pprotobuf4 -Dprotobuf4.version=$(lastword $(PROTOBUF_LINES))
	cd clients/java/adapters/langchain4j && mvn -q -B test
	cd clients/java/adapters/spring-ai && mvn -q -B test
	$(TINY_MODELS) tests/external/maven-consumer/run.sh $(PROTOBUF_LINES)

# Node 20 throughout: every package's engines and every lock file admit it (each package's tests check theirs).
test-typescript: setup dist-npm
	cd clients/typescript && $(NPM_TYPECHECK) && $(TINY_MODELS) npm test --ignore-scripts
	cd clients/typescript-adapters/ai-sdk && $(NPM_TYPECHECK) && npm test --ignore-scripts
	cd clients/typescript-adapters/langchain && $(NPM_TYPECHECK) && npm test --ignore-scripts
	$(TINY_MODELS) tests/external/run-outside-repo.sh npm-consumer bash -c '$(NPM_CI) && npm test'

# The lint beside the Python suite (mypy, its longest part, is one process), then the Java and TypeScript suites
# side by side; each target's output is kept whole, and any failure fails `make test`. (The Python suite beside the
# client suites took longer in all: 659 s against about 620, and its timing tests starve.)
test: setup
	$(MAKE) --no-print-directory -j2 --output-sync=target lint test-python
	$(MAKE) --no-print-directory -j2 --output-sync=target test-java test-typescript

bench: setup
	$(VENV)/bin/uv pip install -q --python $(PY) -c constraints.txt -e '.[dev,bench]'
	$(PY) bench/rerank.py
	$(PY) bench/index.py
	$(PY) bench/beir.py
	$(PY) bench/memory.py
	$(PY) bench/enforce.py
	$(PY) bench/chat.py
	$(PY) bench/footprint.py
	$(PY) bench/store.py
	$(PY) bench/restart.py
	$(PY) bench/evictions.py
	$(PY) bench/snapshot_load.py
	$(PY) bench/lean_reference.py
	$(PY) bench/reads.py
	$(PY) bench/feedback.py
	$(PY) bench/lexical.py
	$(PY) bench/directory.py
	$(PY) bench/filters.py
	$(PY) bench/soak.py --minutes $(SOAK_MINUTES)

# The soak alone: mixed traffic with model reloads for SOAK_MINUTES (memory and latency over time).
soak: setup
	$(PY) bench/soak.py --minutes $(SOAK_MINUTES)

# Every release artifact, one version, with a SHA256SUMS: the wheel and sdist; dist/maven, a Maven repository holding
# the Java client and both adapters (jar, -sources, -javadoc, POM; the client's -tests jar is its test support);
# dist/npm, the npm tarballs of the client and both adapters. docs/releasing.md says how to publish them.
dist: dist-python dist-java dist-npm
	for artifact in ragsidecar-$(VERSION)-py3-none-any.whl ragsidecar-$(VERSION).tar.gz \
		$(foreach a,client langchain4j spring-ai,maven/io/ragsidecar/ragsidecar-$(a)/$(VERSION)/ragsidecar-$(a)-$(VERSION).pom) \
		$(foreach p,client ai-sdk langchain,npm/ragsidecar-$(p)-$(VERSION).tgz); do \
		test -f dist/$$artifact || { echo "dist/$$artifact is missing: every artifact carries version $(VERSION)"; exit 1; }; \
	done
	cd dist && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS

dist-python: $(VENV)/.installed
	rm -f dist/ragsidecar-*.whl dist/ragsidecar-*.tar.gz dist/SHA256SUMS
	$(PY) -m build -o dist

# clean: the jars are compiled against the protobuf-java the POM declares, never classes left by another build. Each
# deploy also installs into the local repository, where the adapters' builds find the client.
dist-java:
	rm -rf dist/maven dist/SHA256SUMS
	for module in $(JAVA_MODULES); do \
		(cd $$module && mvn -q -B clean deploy -DskipTests -DaltDeploymentRepository=dist::file://$(CURDIR)/dist/maven) \
			|| exit 1; \
	done

dist-npm: clients/typescript/node_modules/.installed $(NPM_ADAPTERS:%=%/node_modules/.installed)
	rm -rf dist/npm dist/SHA256SUMS && mkdir -p dist/npm
	for package in clients/typescript $(NPM_ADAPTERS); do \
		(cd $$package && npm pack --silent --pack-destination $(CURDIR)/dist/npm >/dev/null) || exit 1; \
	done

clean:
	rm -rf $(VENV) server/src/ragsidecar/v1 .cache dist build
