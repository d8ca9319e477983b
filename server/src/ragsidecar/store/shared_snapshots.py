"""Partition index snapshots shared through the PostgreSQL database (migration 0008): what a replica with no
snapshot of its own loads instead of building the partition's index from every stored vector.

A replica that has written a local snapshot (store/snapshots.py) of a partition holding at least
`store.shared_snapshot_chunks` chunks also writes it to the database (`upload`, on the snapshot thread): the
snapshot folder's files, cut in parts of PART_BYTES, and a head row with the position (the partition's change the
snapshot holds every change up to) and the parts' total bytes, replacing the space's previous one in one
transaction. It is replaced at most once per `shared_snapshot_interval_s`, or sooner when the change log no longer
reaches back to it; a snapshot of more than `shared_snapshot_max_bytes` is not shared; one replica writes at a time
(an advisory lock others do not wait for).

A replica whose own snapshot is missing (or older than the change log reaches back) reads the space's shared one in
one statement, so from one database snapshot, streamed a few parts at a time into a temp folder beside its own
snapshots (`download`); the folder then replaces its own and is loaded as one, so the manifest's sizes, xxh3_128
checksums and stamp (partition and space) are checked as for any snapshot. A download whose parts do not follow
each other or add up to the head's bytes is torn and never used; one that fails its manifest is refused. Either
way the partition is then loaded from its rows, as without a shared snapshot. After the load, the changes after the
snapshot's position are replayed from the change log.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from ragsidecar import metrics
from ragsidecar.store.cursors import across_tenants

if TYPE_CHECKING:
    import psycopg

    from ragsidecar.store.database import Database

# Bytes per part: large enough that a 0.5 GB snapshot is a hundred rows, small enough to stream.
PART_BYTES = 8 << 20
# Parts a download holds in memory at once (the server-side cursor's fetch size).
_PARTS_FETCHED = 2


@dataclass(frozen=True)
class SharePolicy:
    """Which snapshots are shared and how often (store.shared_snapshot_*)."""

    min_chunks: int = 5000
    interval_s: float = 300.0
    max_bytes: int = 2 << 30


def sharer(database: Database, policy: SharePolicy) -> Callable[[str, str, Path, int], None]:
    """What the snapshot thread runs after writing a partition's snapshot (store/snapshots.py `share`): the upload
    of the snapshot in `folder` when it holds enough chunks and is due. `space` is the space's id, as text."""

    def share(partition: str, space: str, folder: Path, chunks: int) -> None:
        if chunks < policy.min_chunks:
            return
        tenant = database.run_sync(lambda c: tenant_of(c, int(space)))
        if tenant is not None and database.run_sync(lambda c: upload(c, tenant, int(space), folder, policy), tenant):
            metrics.INDEX_SNAPSHOTS.labels("shared").inc()

    return share


def tenant_of(connection: psycopg.Connection, space: int) -> str | None:
    """The tenant whose partition the space belongs to (None: the space is gone). The snapshot thread knows the
    space's id only; the upload then runs as that tenant."""
    across_tenants(connection)
    row = connection.execute("SELECT tenant FROM ragsidecar_memory_spaces WHERE id = %s", (space,)).fetchone()
    return None if row is None else str(row[0])


def upload(connection: psycopg.Connection, tenant: str, space: int, folder: Path, policy: SharePolicy) -> bool:
    """Writes the snapshot in `folder` as the space's shared one when that is due; True when written."""
    position = int(json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["position"])
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    if total > policy.max_bytes or not _due(connection, tenant, space, position, policy.interval_s):
        return False
    connection.execute("DELETE FROM ragsidecar_memory_snapshot_parts WHERE space = %s AND tenant = %s", (space, tenant))
    # One INSERT a part, its bytes sent as they are: COPY FROM refuses tables under row-level security.
    for path in files:
        name = path.relative_to(folder).as_posix()
        for part, data in enumerate(_parts(path)):
            connection.execute(
                "INSERT INTO ragsidecar_memory_snapshot_parts (space, tenant, name, part, data) "
                "VALUES (%s, %s, %s, %s, %b)",
                (space, tenant, name, part, data),
            )
    connection.execute(
        "INSERT INTO ragsidecar_memory_snapshots (space, tenant, position, bytes, written) "
        "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (space, tenant) DO UPDATE SET position = excluded.position, "
        "bytes = excluded.bytes, written = excluded.written",
        (space, tenant, position, total),
    )
    return True


def _parts(path: Path) -> Iterator[bytes]:
    """The file's bytes in parts of PART_BYTES; an empty file is one empty part, so the download creates it."""
    with open(path, "rb") as f:
        data = f.read(PART_BYTES)
        yield data
        while data := f.read(PART_BYTES):
            yield data


def _due(connection: psycopg.Connection, tenant: str, space: int, position: int, interval_s: float) -> bool:
    """Whether a snapshot at `position` should replace the space's shared one: there is none, or it is older and
    either the change log no longer reaches back to it or it was written at least `interval_s` ago. False while
    another replica writes one (the lock is not waited for) or when the space is gone."""
    locked = connection.execute(
        "SELECT pg_try_advisory_xact_lock(hashtextextended('ragsidecar_memory_snapshots:' || %s::text, 0))", (space,)
    ).fetchone()
    if locked is None or not locked[0]:
        return False
    row = connection.execute(
        "SELECT s.log_from, h.position, extract(epoch FROM now() - h.written) FROM ragsidecar_memory_spaces s "
        "LEFT JOIN ragsidecar_memory_snapshots h ON h.space = s.id AND h.tenant = s.tenant "
        "WHERE s.id = %s AND s.tenant = %s",
        (space, tenant),
    ).fetchone()
    if row is None:
        return False
    log_from, shared, age = row
    return shared is None or (position > shared and (shared < log_from or float(age) >= interval_s))


def shared_position(connection: psycopg.Connection, tenant: str, space: int) -> int | None:
    """The position of the space's shared snapshot, None when it has none."""
    row = connection.execute(
        "SELECT position FROM ragsidecar_memory_snapshots WHERE space = %s AND tenant = %s", (space, tenant)
    ).fetchone()
    return None if row is None else int(row[0])


def download(connection: psycopg.Connection, tenant: str, space: int, after: int, upto: int, folder: Path) -> bool:
    """Writes the space's shared snapshot into the empty `folder` when its position is past `after` and at most
    `upto`; False when there is none such, or when what was read is torn (a part missing or out of order, fewer or
    more bytes than its head says)."""
    with connection.cursor(name="ragsidecar_shared_snapshot", binary=True) as cursor:
        cursor.itersize = _PARTS_FETCHED
        cursor.execute(
            "SELECT h.bytes, p.name, p.part, p.data FROM ragsidecar_memory_snapshots h "
            "JOIN ragsidecar_memory_snapshot_parts p ON p.space = h.space AND p.tenant = h.tenant "
            "WHERE h.space = %s AND h.tenant = %s AND h.position > %s AND h.position <= %s ORDER BY p.name, p.part",
            (space, tenant, after, upto),
        )
        return _written(cursor, folder)


def _written(rows: psycopg.ServerCursor, folder: Path) -> bool:
    """Writes each file's parts, in order, into `folder`; False at the first part out of place."""
    expected, written, current, parts = -1, 0, "", 0
    out: BinaryIO | None = None
    try:
        for total, name, part, data in rows:
            expected = int(total)
            if part == 0:  # a file's first part: the next file
                if out is not None:
                    out.close()
                out = open(_inside(folder, name), "wb")  # noqa: SIM115 - one file open at a time, closed below
                current, parts = name, 0
            if out is None or name != current or part != parts:
                return False
            out.write(data)
            written += len(data)
            parts += 1
        return written == expected
    finally:
        if out is not None:
            out.close()


def _inside(folder: Path, name: str) -> Path:
    """The path of a snapshot's file in `folder`; ValueError for a name that would leave it."""
    relative = PurePosixPath(name)
    if relative.is_absolute() or not relative.parts or any(part in ("", ".", "..") for part in relative.parts):
        raise ValueError(f"snapshot file name {name!r} leaves its folder")
    path = folder.joinpath(*relative.parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
