"""Partition index snapshots through the DocumentStore interface, in process, both backends: a store reopened on
the same rows serves from its snapshot plus the changes after it (every write found, nothing removed comes back);
a torn, altered or stale snapshot is refused and the partition rebuilt from its rows; a snapshot of the wrong
change position is never served as current."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

from store_helpers import ANALYSIS, AT, MODEL, Stores, snapshots_written, vector_of

from ragsidecar import metrics
from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.storage import DocumentStore, MemoryDocument


def documents(ids: range, version: str = "") -> list[MemoryDocument]:
    return [MemoryDocument(f"d{i}", f"note {i}{version} about parcel p{i}", {}) for i in ids]


async def found(store: DocumentStore, text: str) -> list[str]:
    partition = await store.index(AT, "notes", MODEL, ANALYSIS)
    hits = partition.index.search(vector_of(text), text, k=3)
    return [h.chunk.meta["document_id"] if "document_id" in h.chunk.meta else h.chunk.id for h in hits]


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
