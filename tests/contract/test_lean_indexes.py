"""Lean partition indexes through the DocumentStore interface, in process, both backends: once a snapshot holds a
partition of at least index.MAPPED_FROM chunks, its index reads the hits' texts and metadata, and the vectors it
rescores with, from the snapshot's files instead of holding them; every hit still reports its own chunk's text,
after writes that follow the snapshot, after a restart, an eviction, a second snapshot and a compaction."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from store_helpers import ANALYSIS, AT, MODEL, Stores, snapshots_written, vector_of

from ragsidecar import metrics
from ragsidecar.knowledge.index import MAPPED_FROM
from ragsidecar.knowledge.storage import DocumentStore, MemoryDocument

COUNT = MAPPED_FROM + 100


def text_of(i: int, version: str = "") -> str:
    return f"entry {i}{version} of the ledger names account a{i}"


def documents(ids: range, version: str = "") -> list[MemoryDocument]:
    return [MemoryDocument(f"d{i}", text_of(i, version), {"n": str(i)}) for i in ids]


async def top_hit(store: DocumentStore, text: str) -> tuple[str, str, object]:
    """(document id, text, field n) of the best hit for `text`, searched by its own vector and words."""
    partition = await store.index(AT, "ledger", MODEL, ANALYSIS)
    (hit,) = partition.index.search(vector_of(text), text, k=1)
    return hit.chunk.meta["document_id"], hit.chunk.text, hit.chunk.meta["fields"]["n"]


async def expect_found(store: DocumentStore, ids: list[int], version: str = "") -> None:
    for i in ids:
        assert await top_hit(store, text_of(i, version)) == (f"d{i}", text_of(i, version), str(i))


async def snapshot_after(store: DocumentStore, data: Path, after: float) -> None:
    """Waits for a snapshot written after `after` (a time.time()) that holds the partition as it is now."""
    await store.index(AT, "ledger", MODEL, ANALYSIS)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any((folder / "manifest.json").stat().st_mtime > after for folder in snapshots_written(data)):
            await asyncio.sleep(0.3)  # past the idle time: the snapshot holds the last change
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no snapshot written")


async def test_hits_read_their_texts_from_the_snapshot_through_writes_restarts_and_evictions(stores: Stores) -> None:
    store = await stores.open()
    await store.upsert(AT, "ledger", documents(range(COUNT)))
    await snapshot_after(store, stores.data, 0)
    await expect_found(store, [0, 7, COUNT - 1])
    # After the snapshot: a new document, a replaced one and a deleted one, searched from the same index.
    changed = time.time()
    await store.upsert(AT, "ledger", [*documents(range(COUNT, COUNT + 1)), *documents(range(3, 4), " revised")])
    await store.delete(AT, "ledger", ["d5"])
    await expect_found(store, [COUNT, 7])
    await expect_found(store, [3], " revised")
    partition = await store.index(AT, "ledger", MODEL, ANALYSIS)
    hits = partition.index.search(vector_of(text_of(5)), text_of(5), k=COUNT)
    assert "d5" not in {h.chunk.meta["document_id"] for h in hits} and len(hits) == COUNT
    # A second snapshot, written from the index that reads the first one's files.
    await snapshot_after(store, stores.data, changed)
    await stores.close_all()

    restarted = await stores.open()
    await expect_found(restarted, [0, 7, COUNT - 1, COUNT])
    await expect_found(restarted, [3], " revised")
    texts = {c.text for c in (await restarted.index(AT, "ledger", MODEL, ANALYSIS)).index.chunks()}
    assert len(texts) == COUNT and text_of(5) not in texts and text_of(3) not in texts
    await stores.close_all()

    evicting = await stores.open(cache_bytes=1)  # every search opens the partition from its snapshot
    for _ in range(2):
        await expect_found(evicting, [1, COUNT])


async def test_a_compaction_of_an_index_reading_its_snapshot_keeps_every_live_text(stores: Stores) -> None:
    store = await stores.open()
    await store.upsert(AT, "ledger", documents(range(COUNT)))
    await snapshot_after(store, stores.data, 0)
    compactions = metrics.INDEX_COMPACTIONS._value.get()
    kept = range(COUNT - 60, COUNT)
    await store.delete(AT, "ledger", [f"d{i}" for i in range(COUNT - 60)])  # dead slots outnumber live ones
    await store.index(AT, "ledger", MODEL, ANALYSIS)  # a replica applies the deletes as it catches up
    deadline = time.monotonic() + 60
    while metrics.INDEX_COMPACTIONS._value.get() == compactions:
        assert time.monotonic() < deadline, "no compaction"
        await asyncio.sleep(0.05)
    partition = await store.index(AT, "ledger", MODEL, ANALYSIS)
    assert sorted(c.text for c in partition.index.chunks()) == sorted(text_of(i) for i in kept)
    await expect_found(store, [kept[0], kept[-1]])
    query = np.asarray(vector_of(text_of(kept[1])))
    assert partition.index.search(query, "", k=1, use_lexical=False)[0].dense == pytest.approx(1.0, abs=1e-5)
