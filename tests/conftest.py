from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from retrieval_helpers import retrieval_config
from sidecar import Sidecar, default_config

LAYERS = ("unit", "contract", "server", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test is marked with its layer (the folder it lives in: `-m e2e` selects exactly tests/e2e), and a test
    that needs the session's PostgreSQL, through its fixture or a postgres backend parameter, is marked postgres,
    so `-m "not postgres"` selects without knowing each file."""
    root = Path(__file__).parent
    for item in items:
        layer = item.path.relative_to(root).parts[0]
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))
        params = getattr(item, "callspec", None)
        if "postgres" in getattr(item, "fixturenames", ()) or params and "postgres" in params.params.values():
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """One shared sidecar with the default config (result cache off, so every call really scores)."""
    config = default_config()
    config["inference"]["cache_bytes"] = 0
    server = Sidecar(tmp_path_factory.mktemp("shared"), config)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def packaged_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """The shared sidecar with the packaged models, for what their quality decides."""
    config = default_config(packaged=True)
    config["inference"]["cache_bytes"] = 0
    server = Sidecar(tmp_path_factory.mktemp("shared-packaged"), config)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def make_sidecar(tmp_path: Path) -> Iterator:
    """Starts dedicated sidecars for a test (custom config, env or signals); stops them afterwards."""
    started: list[Sidecar] = []

    def make(config: dict | None = None, **kwargs) -> Sidecar:
        server = Sidecar(tmp_path / f"s{len(started)}", config, **kwargs)
        server.workdir.mkdir(parents=True, exist_ok=True)
        started.append(server)
        return server

    try:
        yield make
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="session")
def knowledge_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from retrieval_helpers import build_knowledge

    root = tmp_path_factory.mktemp("knowledge")
    build_knowledge(root)
    return root


@pytest.fixture(scope="session")
def retrieval_sidecar(tmp_path_factory: pytest.TempPathFactory, knowledge_root: Path) -> Iterator[Sidecar]:
    """A sidecar whose knowledge root is the folder of real files."""
    server = Sidecar(
        tmp_path_factory.mktemp("retrieval"),
        retrieval_config(knowledge_root, tmp_path_factory.mktemp("retrieval-data")),
    )
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def packaged_retrieval_sidecar(tmp_path_factory: pytest.TempPathFactory, knowledge_root: Path) -> Iterator[Sidecar]:
    """retrieval_sidecar with the packaged models, for what their quality decides (which abstract comes first)."""
    server = Sidecar(
        tmp_path_factory.mktemp("packaged-retrieval"),
        retrieval_config(knowledge_root, tmp_path_factory.mktemp("packaged-retrieval-data"), packaged=True),
    )
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator:
    """One real PostgreSQL (with pgvector) for the session; each test takes a fresh database of it."""
    from postgres import Postgres

    server = Postgres()
    try:
        yield server
    finally:
        server.close()
