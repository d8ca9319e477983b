"""Kill -9 of a PostgreSQL replica while it moves a partition's snapshot shared through the database, through real
sidecars on a real PostgreSQL: killed during the download, the replica's next start sweeps the half-written folder
and serves the shared snapshot plus the change log after it; killed during the upload, the database keeps the
previous shared snapshot whole (no reader ever sees the new one's parts under the old head), and a later replica
loads it and replays every acknowledged write made since.

Each kill lands at a point the test observes rather than one it hopes for, with no test-only code path: the
upload is killed while its last statement (the head's) waits for a row lock the test holds, every part already
replaced in its transaction (seen in pg_stat_activity); the download's statement waits for a table lock while the
test puts a named pipe in its temp folder under the last file's name, and is killed once every other file is
written, stopped at the pipe."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import psycopg
from memory_helpers import found_ids, sharing_replica, upsert_documents
from sidecar import Sidecar

from ragsidecar.v1 import common_pb2
from ragsidecar.v1 import retrieval_pb2 as pb

AT = common_pb2.Scope(tenant="acme-kills", session="s1")


def notes(start: int, count: int) -> dict[str, str]:
    """Short documents, each findable by its own word `marker<i>`."""
    return {f"n{i}": f"parcel marker{i} left the depot on route {i % 7}" for i in range(start, start + count)}


def write(server: Sidecar, documents: dict[str, str]) -> pb.UpsertDocumentsResponse:
    return upsert_documents(server, AT, documents)


def found(server: Sidecar, query: str) -> list[str]:
    return found_ids(server, AT, query)


def holds_every(server: Sidecar, documents: dict[str, str], sampled: list[str]) -> None:
    """The partition holds exactly `documents` (a rewrite of them all changes nothing) and its index finds each
    of `sampled` by its own word."""
    response = write(server, documents)
    assert response.unchanged == len(documents), "an acknowledged document was lost or altered"
    assert response.document_count == len(documents)
    for doc_id in sampled:
        assert doc_id in found(server, f"marker{doc_id[1:]}"), doc_id


def searched_quietly(server: Sidecar) -> threading.Thread:
    """A first search of the partition in the background; the replica is killed under it."""

    def search() -> None:
        try:
            found(server, "parcel")
        except grpc.RpcError:
            pass

    thread = threading.Thread(target=search)
    thread.start()
    return thread


def leftovers(workdir: Path) -> list[Path]:
    """Temp and set-aside snapshot folders in the replica's data folder."""
    return [p for p in (workdir / "data").glob("snapshots/*/.*") if ".tmp-" in p.name or ".old-" in p.name]


def snapshots(workdir: Path) -> list[Path]:
    """Complete snapshot folders in the replica's data folder."""
    manifests = (workdir / "data").glob("snapshots/*/*/manifest.json")
    return [m.parent for m in manifests if not m.parent.name.startswith(".")]


def waited(condition: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def killed(server: Sidecar) -> None:
    server.signal(signal.SIGKILL)
    assert server.process is not None
    server.process.wait(30)  # reaped: its pid no longer looks alive to the next start's sweep


def shared_head(dsn: str) -> tuple[int, int, int] | None:
    """The shared snapshot's (position, bytes in its head, bytes its parts hold), None when there is none."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        row = connection.execute(
            "SELECT h.position, h.bytes, (SELECT coalesce(sum(length(p.data)), 0) FROM ragsidecar_memory_snapshot_parts"
            " p WHERE p.space = h.space AND p.tenant = h.tenant) FROM ragsidecar_memory_snapshots h"
        ).fetchone()
    return None if row is None else (int(row[0]), int(row[1]), int(row[2]))


def shared_files(dsn: str) -> list[tuple[str, int]]:
    """The shared snapshot's files and their sizes, in the order a download writes them (by name, as the
    database's collation orders them)."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT name, sum(length(data)) FROM ragsidecar_memory_snapshot_parts GROUP BY name ORDER BY name"
        ).fetchall()
    return [(str(name), int(size)) for name, size in rows]


@contextmanager
def held(dsn: str, statement: str) -> Iterator[psycopg.Connection]:
    """A transaction holding the lock `statement` takes, rolled back on leaving."""
    with psycopg.connect(dsn) as connection:
        connection.execute(statement)
        try:
            yield connection
        finally:
            connection.rollback()


def waiting_backend(dsn: str, statement_start: str, writing: bool = False) -> int | None:
    """The pid of a backend waiting for a lock while it runs a statement starting with `statement_start`;
    `writing`: one whose transaction has written already (it holds a transaction id)."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        row = connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s"
            " AND (backend_xid IS NOT NULL OR NOT %s)",
            (statement_start + "%", writing),
        ).fetchone()
    return None if row is None else int(row[0])


def backend_gone(dsn: str, pid: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as connection:
        return connection.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is None


def test_a_kill_9_during_the_download_is_swept_at_start_and_the_shared_snapshot_served_after_it(
    postgres, tmp_path: Path
) -> None:
    dsn = postgres.database("shared_snapshot_kills_download")
    first = notes(0, 300)
    late = notes(300, 10)  # written after the shared snapshot: replayed from the change log
    a = sharing_replica(tmp_path / "a", dsn)
    try:
        write(a, first)
        assert found(a, "marker5")
        waited(lambda: shared_head(dsn))
        write(a, late)
    finally:
        a.stop()
    position, head_bytes, part_bytes = shared_head(dsn) or (0, 0, 0)
    assert head_bytes == part_bytes

    *written, (last, _) = shared_files(dsn)  # in the order the download writes them
    b = sharing_replica(tmp_path / "b", dsn)
    # The download's statement waits for this lock, its temp folder made: a named pipe put there under its last
    # file's name stops the download once it has written every other file (opening a pipe to write waits for a
    # reader), and the replica is killed there.
    with held(dsn, "LOCK TABLE ragsidecar_memory_snapshot_parts IN ACCESS EXCLUSIVE MODE"):
        searching = searched_quietly(b)
        waited(lambda: waiting_backend(dsn, "DECLARE"))
        (incoming,) = leftovers(tmp_path / "b")
        (incoming / last).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(incoming / last)
    name, size = written[-1]
    waited(lambda: (incoming / name).is_file() and (incoming / name).stat().st_size == size)
    assert (incoming / "manifest.json").is_file() or last == "manifest.json"  # a manifest with files missing
    killed(b)
    searching.join(60)
    assert leftovers(tmp_path / "b") == [incoming] and not snapshots(tmp_path / "b")

    b = sharing_replica(tmp_path / "b", dsn)
    try:
        assert leftovers(tmp_path / "b") == [], "the killed download's folder was not swept at start"
        holds_every(b, first | late, ["n0", "n150", "n299", *late])
        assert b.metric("ragsidecar_index_snapshots_total", how="fetched") == 1
        assert b.metric("ragsidecar_partition_catch_ups_total", how="reload") == 0
        assert b.metric("ragsidecar_index_snapshots_total", how="refused") == 0
    finally:
        b.stop()
    assert shared_head(dsn) == (position, head_bytes, part_bytes)


def test_a_kill_9_during_the_upload_keeps_the_previous_shared_snapshot_whole_for_later_replicas(
    postgres, tmp_path: Path
) -> None:
    dsn = postgres.database("shared_snapshot_kills_upload")
    first = notes(0, 300)
    later = notes(300, 20)
    a = sharing_replica(
        tmp_path / "a", dsn, shared_snapshot_interval_s=0.01
    )  # every local snapshot past the shared one replaces it
    try:
        write(a, first)
        assert found(a, "marker5")
        waited(lambda: shared_head(dsn))
        before = shared_head(dsn)
        assert before is not None and before[1] == before[2]
        # The upload's last statement, the head's, waits for this row lock: the replica is killed after it has
        # replaced every part in its transaction, before the head names them.
        with held(dsn, "SELECT 1 FROM ragsidecar_memory_snapshots FOR SHARE"):
            write(a, later)
            assert found(a, "marker310")  # applied to the index: its next snapshot is due
            waited(lambda: waiting_backend(dsn, "INSERT INTO ragsidecar_memory_snapshots "))
            assert shared_head(dsn) == before, "a torn upload is visible"  # other readers see the previous one whole
            uploading = waiting_backend(dsn, "INSERT INTO ragsidecar_memory_snapshots ", writing=True)
            assert uploading is not None, "the upload had not replaced the parts in its transaction yet"
            killed(a)
        waited(lambda: backend_gone(dsn, uploading))  # its transaction rolled back
        assert shared_head(dsn) == before
    finally:
        a.stop()

    c = sharing_replica(
        tmp_path / "c", dsn
    )  # no snapshot of its own: loads the shared one, replays the writes after it
    try:
        holds_every(c, first | later, ["n0", "n299", "n300", "n319"])
        assert c.metric("ragsidecar_index_snapshots_total", how="fetched") == 1
        assert c.metric("ragsidecar_partition_catch_ups_total", how="reload") == 0
    finally:
        c.stop()

    a = sharing_replica(
        tmp_path / "a", dsn, shared_snapshot_interval_s=0.01
    )  # the killed uploader, on its own snapshot
    try:
        assert leftovers(tmp_path / "a") == []
        holds_every(a, first | later, ["n0", "n319"])
        assert a.metric("ragsidecar_index_snapshots_total", how="refused") == 0
        assert a.metric("ragsidecar_partition_catch_ups_total", how="reload") == 0
        # Nothing the killed upload held (its advisory lock, its rows) stops the next one: it replaces the old
        # snapshot whole.
        write(a, notes(320, 5))
        assert found(a, "marker321")
        waited(lambda: (shared_head(dsn) or before)[0] > before[0])
        after = shared_head(dsn)
        assert after is not None and after[1] == after[2]
    finally:
        a.stop()
