"""Partition index snapshots through the DocumentStore interface, in process, both backends: a store reopened on
the same rows serves from its snapshot plus the changes after it (every write found, nothing removed comes back);
a torn, altered or stale snapshot is refused and the partition rebuilt from its rows; a snapshot of the wrong
change position is never served as current."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from ragsidecar import metrics
from ragsidecar.knowledge.chunking import Chunk
from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.sources.units import Unit
from ragsidecar.knowledge.storage import DocumentStore, MemoryDocument, Prepared
from ragsidecar.store.embedded import EmbeddedBackend
from ragsidecar.store.snapshots import SnapshotPolicy

DIMENSIONS = 16
MODEL, ANALYSIS = "test-model", "english"
AT = Scope("acme", "s1")
BACKENDS = ["embedded", "postgres"]
_databases = itertools.count()


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

    async def open(self, cache_bytes: int = 1 << 30) -> DocumentStore:
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
            store=StoreConfig(backend="postgres", snapshot_after_changes=1, snapshot_idle_s=0.05),
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


@pytest.fixture(params=BACKENDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    dsn = ""
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres").database(f"snapshots_{next(_databases)}")
    opened = Stores(request.param, tmp_path / "data", dsn)
    try:
        yield opened
    finally:
        await opened.close_all()


def documents(ids: range, version: str = "") -> list[MemoryDocument]:
    return [MemoryDocument(f"d{i}", f"note {i}{version} about parcel p{i}", {}) for i in ids]


async def found(store: DocumentStore, text: str) -> list[str]:
    partition = await store.index(AT, "notes", MODEL, ANALYSIS)
    hits = partition.index.search(vector_of(text), text, k=3)
    return [h.chunk.meta["document_id"] if "document_id" in h.chunk.meta else h.chunk.id for h in hits]


def snapshots_written(data: Path, count: int = 1, timeout: float = 30.0) -> list[Path]:
    """The snapshot folders under data/snapshots, once `count` of them have their manifest."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manifests = [m for m in (data / "snapshots").glob("*/*/manifest.json") if not m.parent.name.startswith(".")]
        if len(manifests) >= count:
            return sorted(m.parent for m in manifests)
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} snapshots under {data}")


def loads(how: str) -> float:
    return metrics.INDEX_LOADS.labels(how)._value.get()


async def settled(store: DocumentStore, data: Path) -> Path:
    """Searches once (the index is built and due for a snapshot), then waits for the snapshot."""
    await store.index(AT, "notes", MODEL, ANALYSIS)
    (folder,) = snapshots_written(data)
    await asyncio.sleep(0.3)  # past the idle time: the snapshot holds the last change
    return folder


async def test_a_reopened_store_serves_from_its_snapshot_plus_the_writes_after_it(stores: Stores) -> None:
    store = await stores.open()
    await store.upsert(AT, "notes", documents(range(40)))
    await settled(store, stores.data)
    # Written after the snapshot: a new document, a replaced one and a deleted one.
    await store.upsert(AT, "notes", [*documents(range(40, 41)), *documents(range(3, 4), " revised")])
    await store.delete(AT, "notes", ["d5"])
    await stores.close_all()

    reopened = await stores.open()
    before = loads("snapshot")
    partition = await reopened.index(AT, "notes", MODEL, ANALYSIS)
    assert loads("snapshot") == before + 1
    assert len(partition.index) == 40 and partition.documents == 40
    texts = {c.text for c in partition.index.chunks()}
    assert "note 40 about parcel p40" in texts and "note 3 revised about parcel p3" in texts
    assert "note 3 about parcel p3" not in texts and "note 5 about parcel p5" not in texts


async def test_a_torn_or_altered_snapshot_is_refused_and_the_partition_rebuilt(stores: Stores) -> None:
    store = await stores.open()
    await store.upsert(AT, "notes", documents(range(30)))
    folder = await settled(store, stores.data)
    await stores.close_all()
    vectors = folder / "vectors.npy"
    vectors.write_bytes(vectors.read_bytes()[:-16])  # torn

    refused = metrics.INDEX_SNAPSHOTS.labels("refused")._value.get()
    partition = await (await stores.open()).index(AT, "notes", MODEL, ANALYSIS)
    assert metrics.INDEX_SNAPSHOTS.labels("refused")._value.get() == refused + 1
    assert len(partition.index) == 30


async def test_a_snapshot_of_another_partition_or_space_is_never_served(stores: Stores) -> None:
    store = await stores.open()
    await store.upsert(AT, "notes", documents(range(10)))
    folder = await settled(store, stores.data)
    await store.upsert(Scope("acme", "s2"), "notes", documents(range(100, 103)))
    await stores.close_all()
    # The s1 partition's snapshot put where the s2 partition's would be: its stamp names s1.
    other = await stores.open()
    await other.index(Scope("acme", "s2"), "notes", MODEL, ANALYSIS)
    s2_folder = next(p for p in snapshots_written(stores.data, 2) if p != folder)
    await stores.close_all()
    shutil.rmtree(s2_folder)
    shutil.copytree(folder, s2_folder)

    partition = await (await stores.open()).index(Scope("acme", "s2"), "notes", MODEL, ANALYSIS)
    assert sorted(c.text for c in partition.index.chunks()) == sorted(d.text for d in documents(range(100, 103)))


async def test_leftover_temp_folders_are_swept_when_the_store_opens(stores: Stores) -> None:
    store = await stores.open()
    await store.upsert(AT, "notes", documents(range(5)))
    folder = await settled(store, stores.data)
    await stores.close_all()
    leftover = folder.parent / f".{folder.name}.tmp-999999999-x"
    shutil.copytree(folder, leftover)
    await stores.open()
    assert not leftover.exists() and folder.exists()


async def test_a_database_of_schema_1_gets_its_change_stamps_and_snapshots_then_follow(tmp_path: Path) -> None:
    data = tmp_path / "data"
    opened = Stores("embedded", data, "")
    store = await opened.open()
    await store.upsert(AT, "notes", documents(range(12)))
    await opened.close_all()
    with sqlite3.connect(data / "memory.sqlite3") as old:  # as schema 1 was: no change stamps, no typed metadata
        old.executescript(
            "DROP INDEX chunks_changed; ALTER TABLE chunks DROP COLUMN changed; DROP TABLE changes; "
            "DROP INDEX documents_expiring; ALTER TABLE documents DROP COLUMN typed; "
            "ALTER TABLE documents DROP COLUMN created; ALTER TABLE documents DROP COLUMN updated; "
            "ALTER TABLE documents DROP COLUMN expires; PRAGMA user_version = 1;"
        )

    store = await opened.open()
    await store.upsert(AT, "notes", documents(range(12, 14)))
    await settled(store, data)
    await store.upsert(AT, "notes", documents(range(14, 15)))
    await opened.close_all()
    partition = await (await opened.open()).index(AT, "notes", MODEL, ANALYSIS)
    assert sorted(c.text for c in partition.index.chunks()) == sorted(d.text for d in documents(range(15)))
    await opened.close_all()
