"""Partition snapshots shared through the database (store/shared_snapshots.py), through the DocumentStore interface
with a real PostgreSQL: a replica with no snapshot of its own loads the one another replica shared and replays the
changes after it (every write found, nothing removed comes back, nothing built); a torn, altered or stale shared
snapshot is never served (the partition is loaded from its rows); one past the size bound is not shared; a
cleared partition's goes with its rows."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psycopg
import pytest
from store_helpers import ANALYSIS, AT, MODEL, Stores, databases, snapshots_written, vector_of

from ragsidecar import metrics
from ragsidecar.knowledge.storage import DocumentStore, MemoryDocument

SHARED = {"shared_snapshot_chunks": 1}


def documents(ids: range, version: str = "") -> list[MemoryDocument]:
    return [MemoryDocument(f"d{i}", f"note {i}{version} about parcel p{i}", {}) for i in ids]


def counted(metric: str, how: str) -> float:
    counter = metrics.INDEX_SNAPSHOTS if metric == "snapshots" else metrics.PARTITION_CATCH_UPS
    return counter.labels(how)._value.get()


class Replicas:
    """Replicas of the postgres store on one database, each with a data folder of its own."""

    def __init__(self, dsn: str, folder: Path) -> None:
        self.dsn, self.folder = dsn, folder
        self.opened: list[Stores] = []

    async def open(self, name: str, **settings: object) -> tuple[DocumentStore, Path]:
        stores = Stores("postgres", self.folder / name, self.dsn)
        self.opened.append(stores)
        return await stores.open(**{**SHARED, **settings}), stores.data

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.dsn, autocommit=True) as connection:
            cursor = connection.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def shared(self, timeout: float = 30.0, until: Callable[[int], bool] = lambda _: True) -> int:
        """The position of the (one) shared snapshot, once there is one that `until` accepts."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.sql("SELECT position FROM ragsidecar_memory_snapshots")
            if rows and until(rows[0][0]):
                return int(rows[0][0])
            time.sleep(0.05)
        raise AssertionError("no snapshot shared")


@pytest.fixture
async def replicas(postgres, tmp_path: Path) -> AsyncIterator[Replicas]:  # type: ignore[no-untyped-def]
    opened = Replicas(postgres.database(f"shared_{next(databases)}"), tmp_path)
    try:
        yield opened
    finally:
        for stores in opened.opened:
            await stores.close_all()


async def shared_by_a(replicas: Replicas, count: int) -> tuple[DocumentStore, int]:
    """Replica A writes `count` documents and searches: its snapshot is written and shared."""
    a, data = await replicas.open("a")
    await a.upsert(AT, "notes", documents(range(count)))
    await a.index(AT, "notes", MODEL, ANALYSIS)
    snapshots_written(data)
    return a, replicas.shared()


@pytest.mark.parametrize("count", [40, 1100])  # 1100: over index.MAPPED_FROM, a snapshot read from its files
async def test_a_replica_with_no_snapshot_loads_the_shared_one_and_replays_the_writes_after_it(
    replicas: Replicas, count: int
) -> None:
    a, position = await shared_by_a(replicas, count)
    # After the shared snapshot: a new document, a replaced one and a deleted one.
    await a.upsert(AT, "notes", [*documents(range(count, count + 1)), *documents(range(3, 4), " revised")])
    await a.delete(AT, "notes", ["d5"])
    assert replicas.shared() == position  # not replaced: written less than shared_snapshot_interval_s ago

    fetched, reloads, changes = (
        counted("snapshots", "fetched"),
        counted("catch_ups", "reload"),
        counted("catch_ups", "changes"),
    )
    b, _ = await replicas.open("b")
    partition = await b.index(AT, "notes", MODEL, ANALYSIS)
    assert counted("snapshots", "fetched") == fetched + 1
    assert counted("catch_ups", "reload") == reloads and counted("catch_ups", "changes") == changes + 1
    assert len(partition.index) == count and partition.documents == count
    texts = {c.text for c in partition.index.chunks()}
    assert f"note {count} about parcel p{count}" in texts and "note 3 revised about parcel p3" in texts
    assert "note 3 about parcel p3" not in texts and "note 5 about parcel p5" not in texts
    hits = partition.index.search(vector_of("note 3 revised about parcel p3"), "revised parcel p3", k=1)
    assert hits[0].chunk.text == "note 3 revised about parcel p3"


def tear(replicas: Replicas) -> None:
    """One part of the shared snapshot's vectors gone: fewer bytes than its head says."""
    replicas.sql("DELETE FROM ragsidecar_memory_snapshot_parts WHERE name = 'vectors.npy'")


def alter(replicas: Replicas) -> None:
    """One byte of the shared snapshot's vectors changed, its size kept: only the checksum tells."""
    replicas.sql(
        "UPDATE ragsidecar_memory_snapshot_parts SET data = set_byte(data, length(data) - 1, "
        "255 - get_byte(data, length(data) - 1)) WHERE name = 'vectors.npy'"
    )


def stale(replicas: Replicas) -> None:
    """The change log no longer reaches back to the shared snapshot: it would miss removals."""
    replicas.sql("UPDATE ragsidecar_memory_spaces SET log_from = log_from + 1000")
    replicas.sql("UPDATE ragsidecar_memory_partitions SET changes = changes + 1000")


def ahead(replicas: Replicas) -> None:
    """A shared snapshot past the partition's latest change (a database restored from an older backup)."""
    replicas.sql("UPDATE ragsidecar_memory_snapshots SET position = position + 1000")


@pytest.mark.parametrize("spoil", [tear, alter, stale, ahead])
async def test_a_torn_altered_or_stale_shared_snapshot_is_never_served(replicas: Replicas, spoil) -> None:  # type: ignore[no-untyped-def]
    a, _ = await shared_by_a(replicas, 30)
    await a.upsert(AT, "notes", documents(range(30, 31)))
    spoil(replicas)

    refused, reloads = counted("snapshots", "refused"), counted("catch_ups", "reload")
    b, _ = await replicas.open("b")
    partition = await b.index(AT, "notes", MODEL, ANALYSIS)
    assert counted("catch_ups", "reload") == reloads + 1  # loaded from the rows
    assert counted("snapshots", "refused") == refused + (spoil is alter)
    assert len(partition.index) == 31
    assert "note 30 about parcel p30" in {c.text for c in partition.index.chunks()}


async def test_a_snapshot_past_the_size_bound_is_not_shared(replicas: Replicas) -> None:
    a, data = await replicas.open("a", shared_snapshot_max_bytes=1000)
    await a.upsert(AT, "notes", documents(range(30)))
    await a.index(AT, "notes", MODEL, ANALYSIS)
    snapshots_written(data)
    time.sleep(0.5)  # past the snapshot thread's share, had it shared
    assert replicas.sql("SELECT count(*) FROM ragsidecar_memory_snapshot_parts") == [(0,)]


async def test_a_snapshot_the_change_log_no_longer_reaches_is_replaced(replicas: Replicas) -> None:
    a, position = await shared_by_a(replicas, 20)
    replicas.sql("UPDATE ragsidecar_memory_spaces SET log_from = %s", (position + 1,))
    await a.upsert(AT, "notes", documents(range(20, 22)))
    await a.index(AT, "notes", MODEL, ANALYSIS)
    assert replicas.shared(until=lambda p: p > position) > position


async def test_a_cleared_partition_drops_its_shared_snapshot(replicas: Replicas) -> None:
    a, _ = await shared_by_a(replicas, 20)
    await a.clear(AT, "notes")
    assert replicas.sql("SELECT count(*) FROM ragsidecar_memory_snapshots") == [(0,)]
    assert replicas.sql("SELECT count(*) FROM ragsidecar_memory_snapshot_parts") == [(0,)]
