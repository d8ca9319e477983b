# One-command set-up: `make run` serves, `make test` runs every test suite. Both create what they need.
# `make dist` builds the sdist and wheel into dist/ (see README.md, "Install from the wheel").
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CONFIG ?= config/ragsidecar.toml
PROTOS := $(wildcard proto/ragsidecar/v1/*.proto)
GEN_STAMP := server/src/ragsidecar/v1/.generated
BUF := clients/typescript/node_modules/.bin/buf
SOAK_MINUTES ?= 30

.PHONY: setup run test test-python test-java test-typescript lint models bench soak doctor dist clean

setup: $(VENV)/.installed $(GEN_STAMP) models

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $@

$(GEN_STAMP): $(PROTOS) $(VENV)/.installed
	rm -rf server/src/ragsidecar/v1
	$(PY) -m grpc_tools.protoc -I proto --python_out=server/src --grpc_python_out=server/src \
		--pyi_out=server/src $(PROTOS)
	touch $@

# The checkout is the ragsidecar home here: models in ./models, their download cache in ./.cache.
models: $(VENV)/.installed
	RAGSIDECAR_HOME=$(CURDIR) $(VENV)/bin/ragsidecar models install

run: setup
	$(VENV)/bin/ragsidecar serve --config $(CONFIG)

doctor: setup
	$(VENV)/bin/ragsidecar doctor --config $(CONFIG)

clients/typescript/node_modules/.installed: clients/typescript/package.json clients/typescript/package-lock.json
	cd clients/typescript && npm ci --no-audit --no-fund --silent
	touch $@

lint: clients/typescript/node_modules/.installed
	$(BUF) lint

test-python: setup
	$(PY) -m pytest -q

test-java: setup
	cd clients/java && mvn -q -B test
	cd clients/java && mvn -q -B test -Pprotobuf3
	cd clients/java && mvn -q -B install -DskipTests
	cd clients/java/adapters/langchain4j && mvn -q -B test
	cd clients/java/adapters/spring-ai && mvn -q -B test
	cd clients/java/adapters/langchain4j && mvn -q -B install -DskipTests
	cd clients/java/adapters/spring-ai && mvn -q -B install -DskipTests
	cd tests/external/maven-consumer && mvn -q -B test

test-typescript: setup clients/typescript/node_modules/.installed
	cd clients/typescript && npm test
	cd clients/typescript-adapters/ai-sdk && npm ci --no-audit --no-fund --silent && npm test
	cd clients/typescript-adapters/langchain && npm ci --no-audit --no-fund --silent && npm test
	tests/external/run-outside-repo.sh npm-consumer bash -c 'npm ci --no-audit --no-fund --silent && npm test'

test: lint test-python test-java test-typescript

bench: setup
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev,bench]'
	$(PY) bench/rerank.py
	$(PY) bench/index.py
	$(PY) bench/beir.py
	$(PY) bench/enforce.py
	$(PY) bench/chat.py
	$(PY) bench/footprint.py
	$(PY) bench/store.py
	$(PY) bench/soak.py --minutes $(SOAK_MINUTES)

# The soak alone: mixed traffic with model reloads for SOAK_MINUTES (memory and latency over time).
soak: setup
	$(PY) bench/soak.py --minutes $(SOAK_MINUTES)

dist: $(VENV)/.installed
	$(PY) -m build -o dist

clean:
	rm -rf $(VENV) server/src/ragsidecar/v1 .cache dist build
