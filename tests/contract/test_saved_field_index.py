"""A snapshot's field index through the DocumentStore interface, in process, both backends: a partition of at least
index.MAPPED_FROM chunks opened from its snapshot filters with the field index the snapshot saved, and its filtered
searches (keep, and hide as expiry filters) find exactly the documents whose fields the filter keeps, with writes
after the snapshot replayed, a damaged field file refused (the index rebuilt from the rows), and a snapshot written
before field indexes were saved still filtering (its next snapshot saves one)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from store_helpers import ANALYSIS, AT, MODEL, Stores, snapshots_written, vector_of

from ragsidecar import metrics
from ragsidecar.knowledge import filters as f
from ragsidecar.knowledge.index import MAPPED_FROM
from ragsidecar.knowledge.storage import DocumentStore, MemoryDocument

COUNT = MAPPED_FROM + 100
FIELD_FILES = ("fields.json", "field_members.npy", "field_values.jsonl")
HOUR_NS = 3600 * 10**9
NOW = time.time_ns()
FILTERS: list[f.Filter] = [
    f.Compare("team", f.Op.EQUAL, "t1"),
    f.In("team", ("t0", "t2"), negated=True),
    f.Compare("n", f.Op.GREATER_OR_EQUAL, 7.0),
    f.Compare("tags", f.Op.EQUAL, "b2"),
    f.Exists(f.EXPIRES_AT),
    f.Not(f.Compare("team", f.Op.EQUAL, "t3")),
    f.All((f.Compare("team", f.Op.EQUAL, "t1"), f.Compare("n", f.Op.LESS, 3.0))),
    f.Compare(f.ID, f.Op.EQUAL, "d3"),
]
# Expiry as a search an hour from now sees it: the documents expiring within the hour hidden.
HIDE = f.expired_at(NOW + HOUR_NS)


def documents(ids: range, version: str = "") -> list[MemoryDocument]:
    return [
        MemoryDocument(
            f"d{i}",
            f"note {i}{version} about parcel p{i}",
            {"team": f"t{(i + len(version)) % 4}"},
            {"n": float(i % 10), "tags": ("a", f"b{i % 3}")},
            expires_at=NOW + HOUR_NS // 2 if i % 5 == 0 else None,
        )
        for i in ids
    ]


async def snapshot_of(stores: Stores) -> Path:
    """The folder of the partition's snapshot of COUNT documents, written and the store closed."""
    store = await stores.open()
    await store.upsert(AT, "notes", documents(range(COUNT)))
    await store.index(AT, "notes", MODEL, ANALYSIS)
    (folder,) = snapshots_written(stores.data)
    await asyncio.sleep(0.3)  # past the idle time: the snapshot holds the last change
    await stores.close_all()
    return folder


async def written_after_the_snapshot(stores: Stores) -> None:
    """Additions, replacements (another team) and deletions, none of them in a snapshot."""
    store = await stores.open(cache_bytes=0)  # snapshots read, none written over them after the writes below
    await store.upsert(AT, "notes", [*documents(range(COUNT, COUNT + 30)), *documents(range(3, 40, 4), " revised")])
    await store.delete(AT, "notes", [f"d{i}" for i in range(1, 60, 6)])
    await stores.close_all()


async def expect_filtered_as_the_rows_say(store: DocumentStore) -> None:
    """Every filter, with and without the expiry hidden, finds exactly the documents whose fields it keeps."""
    rows = await store.get(AT, "notes", [f"d{i}" for i in range(COUNT + 30)], now=0)
    partition = await store.index(AT, "notes", MODEL, ANALYSIS)
    query = vector_of("note 1 about parcel p1")
    for keep in FILTERS:
        for hide in (None, HIDE):
            hits = partition.index.search(query, "", k=2 * COUNT, use_lexical=False, keep=keep, hide=hide)
            expected = {
                d.id for d in rows if f.matches(keep, d.fields()) and not (hide and f.matches(hide, d.fields()))
            }
            assert {h.chunk.meta["document_id"] for h in hits} == expected, (keep, hide)


def counted(metric: object, label: str) -> float:
    return metric.labels(label)._value.get()  # type: ignore[attr-defined]


async def test_filtered_searches_after_a_restart_with_writes_after_the_snapshot_find_what_the_rows_hold(
    stores: Stores,
) -> None:
    folder = await snapshot_of(stores)
    assert set(FIELD_FILES) <= set(json.loads((folder / "manifest.json").read_text())["files"])
    await written_after_the_snapshot(stores)

    loaded = counted(metrics.INDEX_LOADS, "snapshot")
    store = await stores.open()
    await expect_filtered_as_the_rows_say(store)
    assert counted(metrics.INDEX_LOADS, "snapshot") == loaded + 1
    # Written after the filtered searches: changes to an index filtering over its snapshot's field index.
    await store.upsert(AT, "notes", documents(range(0, 20, 3), " again"))
    await store.delete(AT, "notes", ["d7", f"d{COUNT + 1}"])
    await expect_filtered_as_the_rows_say(store)
    await asyncio.sleep(0.5)  # a second snapshot, written from the first one's field index and the changes
    await stores.close_all()

    await expect_filtered_as_the_rows_say(await stores.open())


async def test_a_damaged_field_file_is_refused_and_the_index_rebuilt_from_the_rows(stores: Stores) -> None:
    folder = await snapshot_of(stores)
    path = folder / "field_members.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # same size: only the checksum tells
    path.write_bytes(bytes(data))

    refused = counted(metrics.INDEX_SNAPSHOTS, "refused")
    store = await stores.open()
    await expect_filtered_as_the_rows_say(store)
    assert counted(metrics.INDEX_SNAPSHOTS, "refused") == refused + 1


async def test_a_snapshot_saved_without_a_field_index_still_filters_and_its_next_one_saves_one(
    stores: Stores,
) -> None:
    folder = await snapshot_of(stores)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    for name in FIELD_FILES:
        (folder / name).unlink()
        del manifest["files"][name]
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")

    loaded = counted(metrics.INDEX_LOADS, "snapshot")
    store = await stores.open()
    await expect_filtered_as_the_rows_say(store)
    assert counted(metrics.INDEX_LOADS, "snapshot") == loaded + 1
    await store.upsert(AT, "notes", documents(range(COUNT, COUNT + 5)))
    await store.index(AT, "notes", MODEL, ANALYSIS)
    deadline = time.monotonic() + 30
    while not all((p / "fields.json").is_file() for p in snapshots_written(stores.data)):
        assert time.monotonic() < deadline, "no snapshot with a field index"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    await stores.close_all()

    await expect_filtered_as_the_rows_say(await stores.open())
