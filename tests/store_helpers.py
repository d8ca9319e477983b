"""The storage contract suite's shared parts: a MEMORY store of either backend opened (and reopened) in process on
the same rows and data folder, with vectors drawn from each text's hash and snapshots due at once."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragsidecar.knowledge.chunking import Chunk
from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.sources.units import Unit
from ragsidecar.knowledge.storage import DocumentStore, Prepared
from ragsidecar.store.embedded import EmbeddedBackend
from ragsidecar.store.snapshots import SnapshotPolicy

DIMENSIONS = 16
MODEL, ANALYSIS = "test-model", "english"
AT = Scope("acme", "s1")
BACKENDS = ["embedded", "postgres"]
# Each test's PostgreSQL database gets a name of its own.
databases = itertools.count()


def vector_of(text: str) -> np.ndarray:
    """A unit vector drawn from the text's hash: equal texts, equal vectors."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(DIMENSIONS).astype(np.float32)
    return vector / np.linalg.norm(vector)


async def prepare(scope: Scope, name: str, units: list[Unit]) -> Prepared:
    """One chunk per document, its vector drawn from its text (what the catalog's chunk-and-embed hands over)."""
    chunks = [
        Chunk(f"{name}:{u.provenance.document_id}:{i}", name, i, u.text, u.provenance, f"h{i}", 0)
        for i, u in enumerate(units)
    ]
    vectors = np.stack([vector_of(u.text) for u in units]) if units else np.zeros((0, DIMENSIONS), np.float32)
    return Prepared(MODEL, ANALYSIS, chunks, vectors)


@dataclass
class Opened:
    store: DocumentStore
    close: Callable[[], object]


class Stores:
    """Opens (and reopens) one backend's MEMORY store on the same rows and data folder, snapshots due at once."""

    def __init__(self, backend: str, data: Path, dsn: str) -> None:
        self.backend, self.data, self.dsn = backend, data, dsn
        self.opened: list[Opened] = []

    async def open(self, cache_bytes: int = 1 << 30, **store_settings: Any) -> DocumentStore:
        """`store_settings`: more [store] settings of the postgres backend (shared_snapshot_*)."""
        policy = SnapshotPolicy(after_changes=1, idle_s=0.05)
        if self.backend == "embedded":
            backend = EmbeddedBackend(self.data, cache_bytes, 1 << 20, 1 << 24, 1, "f16", policy)
            store = backend.documents("memory", prepare)
            self.opened.append(Opened(store, backend.close))
            return store
        from ragsidecar.config import Config, PathsConfig, RetrievalConfig, StoreConfig
        from ragsidecar.store.database import open_database
        from ragsidecar.store.postgres import PostgresBackend

        config = Config(
            paths=PathsConfig(data_dir=str(self.data)),
            retrieval=RetrievalConfig(memory_cache_bytes=cache_bytes),
            store=StoreConfig(backend="postgres", snapshot_after_changes=1, snapshot_idle_s=0.05, **store_settings),
        )
        database = open_database(config, {"RAGSIDECAR_STORE_DSN": self.dsn})
        assert database is not None
        postgres = PostgresBackend(config, database)
        await postgres.start()
        store = postgres.documents("memory", prepare)
        self.opened.append(Opened(store, postgres.close))
        return store

    async def close_all(self) -> None:
        for opened in self.opened:
            await opened.close()  # type: ignore[misc]
        self.opened.clear()


def snapshots_written(data: Path, count: int = 1, timeout: float = 30.0) -> list[Path]:
    """The snapshot folders under data/snapshots, once `count` of them have their manifest."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manifests = [m for m in (data / "snapshots").glob("*/*/manifest.json") if not m.parent.name.startswith(".")]
        if len(manifests) >= count:
            return sorted(m.parent for m in manifests)
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} snapshots under {data}")
