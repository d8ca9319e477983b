"""The replay after a snapshot, through the DocumentStore interface, both backends: whatever the writes made after
the snapshot (only additions, only removals, replacements, or a mix that leaves the partition its size), the
reopened store holds exactly the rows' chunks. The embedded store skips reading the partition's keys when its rows
show that nothing was removed: these cases tell that shortcut from a wrong one."""

from __future__ import annotations

import asyncio

import pytest
from store_helpers import ANALYSIS, AT, MODEL, Stores, snapshots_written

from ragsidecar.knowledge.storage import DocumentStore, MemoryDocument


def documents(ids: range, version: str = "") -> list[MemoryDocument]:
    return [MemoryDocument(f"d{i}", f"note {i}{version} about parcel p{i}", {}) for i in ids]


async def added(store: DocumentStore) -> None:
    await store.upsert(AT, "notes", documents(range(20, 23)))


async def removed(store: DocumentStore) -> None:
    await store.delete(AT, "notes", ["d1", "d2"])


async def replaced(store: DocumentStore) -> None:
    await store.upsert(AT, "notes", documents(range(4, 6), " revised"))


async def swapped(store: DocumentStore) -> None:
    """As many removed as added: the partition keeps its size."""
    await store.delete(AT, "notes", ["d7"])
    await store.upsert(AT, "notes", documents(range(30, 31)))


@pytest.mark.parametrize("write", [added, removed, replaced, swapped])
async def test_a_reopened_store_holds_exactly_the_rows_whatever_was_written_after_the_snapshot(
    stores: Stores, write
) -> None:  # type: ignore[no-untyped-def]
    store = await stores.open()
    await store.upsert(AT, "notes", documents(range(20)))
    await store.index(AT, "notes", MODEL, ANALYSIS)
    snapshots_written(stores.data)
    await asyncio.sleep(0.3)  # past the idle time: the snapshot holds the last change
    await stores.close_all()
    store = await stores.open(cache_bytes=0)  # snapshots read, none written over them after the write below
    await write(store)
    expected = {d.text for d in await store.get(AT, "notes", [f"d{i}" for i in range(40)], now=0)}
    await stores.close_all()

    partition = await (await stores.open()).index(AT, "notes", MODEL, ANALYSIS)
    assert {c.text for c in partition.index.chunks()} == expected
    assert len(partition.index) == partition.documents == len(expected)
