"""The embedded backend (`[store] backend = "embedded"`): everything kept by this process alone.

MEMORY documents live in one SQLite database in WAL mode (`data_dir/memory.sqlite3`), with the chunks and
float32 vectors each document was indexed with. A write is one transaction of the rows it changes, committed
with `synchronous = FULL` before it is acknowledged: a kill -9 (or a power cut) at any moment leaves every
acknowledged write and none of a write in flight, and no file to sweep (SQLite's own journal is rolled back or
forward when the database is next opened). Its cost is what it writes, whatever the partition holds.

Each partition searched is held as an incremental index (store/resident.py); a write applies its changes to
it before it is acknowledged, so the next search sees them at the price of a steady search. Every write draws
the store's next change number and stamps the chunks it adds with it, so an index opened from its snapshot
(store/snapshots.py, under `data_dir/snapshots/memory`) replays only the chunks stamped after the snapshot's
position and drops the keys the rows no longer hold; with no usable snapshot it is rebuilt from the stored
vectors. Documents with no chunks in the space a search asks for (written under
another embedder, or migrated from 0.2.0's JSON files) are chunked and embedded first, once.

Chat bindings' corpora use the same code on an in-memory SQLite database (lost on restart), bounded
as a whole by retrieval.binding_store_bytes (RESOURCE_EXHAUSTED past it, the write rolled back).

Operations of one partition run one at a time (an asyncio lock per partition stripe); SQLite work runs off the
event loop, on one connection per store.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from ragsidecar import metrics
from ragsidecar.errors import ErrorKind, SidecarError
from ragsidecar.identifiers import key_of
from ragsidecar.knowledge import filters
from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk
from ragsidecar.knowledge.sources.units import Unit
from ragsidecar.knowledge.storage import (
    LIST_SCAN_BOUND,
    PURGE_BOUND,
    Binding,
    DeleteOutcome,
    LocalVectors,
    MemoryDocument,
    Page,
    PartitionIndex,
    Prepare,
    Prepared,
    UpsertOutcome,
    check_request_size,
    document_unit,
    page_of,
    units_of,
)
from ragsidecar.store.resident import Resident, ResidentIndexes, chunk_keys, indexed, space_of, with_fields
from ragsidecar.store.snapshots import PartitionSnapshots, SnapshotPolicy

log = logging.getLogger(__name__)

_STRIPES = 64
_SCHEMA_VERSION = 3
_SCHEMA = """
CREATE TABLE IF NOT EXISTS partitions (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,          -- key_of(tenant, session, source): no choice of ids makes two collide
    tenant TEXT NOT NULL, session TEXT NOT NULL, source TEXT NOT NULL,
    documents INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0,
    next_seq INTEGER NOT NULL DEFAULT 0,
    space TEXT NOT NULL DEFAULT ''     -- the space (model, analysis) its chunks were made in
);
CREATE TABLE IF NOT EXISTS documents (
    partition INTEGER NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, text TEXT NOT NULL, metadata TEXT NOT NULL,
    typed TEXT NOT NULL DEFAULT '{}',  -- typed metadata, filters.to_json
    created INTEGER NOT NULL DEFAULT 0, updated INTEGER NOT NULL DEFAULT 0,  -- nanoseconds since the epoch
    expires INTEGER,                   -- nanoseconds since the epoch; NULL: never
    PRIMARY KEY (partition, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS documents_in_order ON documents (partition, seq);
CREATE INDEX IF NOT EXISTS documents_expiring ON documents (expires) WHERE expires IS NOT NULL;
CREATE TABLE IF NOT EXISTS chunks (
    partition INTEGER NOT NULL, key TEXT NOT NULL, document TEXT NOT NULL, id TEXT NOT NULL, text TEXT NOT NULL,
    meta TEXT NOT NULL, vector BLOB NOT NULL,
    changed INTEGER NOT NULL DEFAULT 0, -- the store's change that wrote it (a snapshot replays those after its own)
    PRIMARY KEY (partition, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS chunks_of_document ON chunks (partition, document);
CREATE TABLE IF NOT EXISTS changes (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    last INTEGER NOT NULL              -- the store's latest change: drawn by every write, never reused
);
INSERT OR IGNORE INTO changes (id, last) VALUES (0, 0);
"""
# Schema 1 (0.2.0's successor, before snapshots) lacked the chunks' change stamp and the store's change sequence:
# its chunks count as change 0, before any snapshot.
_UPGRADE_1 = (
    "ALTER TABLE chunks ADD COLUMN changed INTEGER NOT NULL DEFAULT 0",
    "CREATE TABLE changes (id INTEGER PRIMARY KEY CHECK (id = 0), last INTEGER NOT NULL)",
    "INSERT INTO changes (id, last) VALUES (0, 0)",
)
_CHANGED_INDEX = "CREATE INDEX IF NOT EXISTS chunks_changed ON chunks (partition, changed)"
# Schema 2 lacked typed metadata, timestamps and expiry: its documents are stamped with the upgrade's time, and
# every chunk with a new change, so a snapshot taken before (whose chunks lack their documents' fields) replays all.
_UPGRADE_2 = (
    "ALTER TABLE documents ADD COLUMN typed TEXT NOT NULL DEFAULT '{}'",
    "ALTER TABLE documents ADD COLUMN created INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE documents ADD COLUMN updated INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE documents ADD COLUMN expires INTEGER",
    "UPDATE documents SET created = :now, updated = :now",
    "UPDATE changes SET last = last + 1 WHERE id = 0",
    "UPDATE chunks SET changed = (SELECT last FROM changes WHERE id = 0)",
)
# A document row's columns, as _document reads them.
_DOCUMENT = "d.id, d.text, d.metadata, d.typed, d.expires, d.created, d.updated"
_VECTOR = np.dtype("<f4")


@dataclass(frozen=True)
class _Partition:
    id: int
    documents: int
    next_seq: int
    space: str


class EmbeddedDocuments:
    """A DocumentStore on SQLite: `path` a database file, or None for an in-memory one (binding corpora)."""

    def __init__(
        self,
        path: Path | None,
        prepare: Prepare,
        indexes: ResidentIndexes,
        *,
        name: str,
        max_request_bytes: int,
        max_bytes: int | None = None,
    ) -> None:
        self._prepare = prepare
        self._indexes = indexes
        self._max_request_bytes = max_request_bytes
        self._max_bytes = max_bytes
        self._db = _Database(path)
        self._locks = [asyncio.Lock() for _ in range(_STRIPES)]
        metrics.track_size(name, self)

    # -- size, as ragsidecar_cache_bytes / _entries report it -------------------------------------------

    def __len__(self) -> int:
        """Partitions stored."""
        return int(self._db.read(lambda c: c.execute("SELECT count(*) FROM partitions").fetchone()[0]))

    @property
    def bytes(self) -> int:
        """Bytes of the documents stored (what binding_store_bytes bounds)."""
        return int(self._db.read(lambda c: c.execute("SELECT coalesce(sum(bytes), 0) FROM partitions").fetchone()[0]))

    # -- reads ------------------------------------------------------------------------------------------

    async def units(self, scope: Scope, name: str) -> list[Unit]:
        """Every document not expired, in the order first written."""
        key = _key(scope, name)
        rows = await asyncio.to_thread(
            self._db.read,
            lambda c: c.execute(
                "SELECT d.id, d.text FROM documents d JOIN partitions p ON p.id = d.partition WHERE p.key = ? "
                "AND (d.expires IS NULL OR d.expires > ?) ORDER BY d.seq",
                (key, time.time_ns()),
            ).fetchall(),
        )
        return [document_unit(i, text) for i, text in rows]

    async def count(self, scope: Scope, name: str) -> int:
        partition = await asyncio.to_thread(self._db.read, lambda c: _partition(c, _key(scope, name)))
        return 0 if partition is None else partition.documents

    async def index(self, scope: Scope, name: str, model: str, analysis: str) -> PartitionIndex:
        key, space = _key(scope, name), space_of(model, analysis)
        resident = self._indexes.get(key, space)
        if resident is not None:  # every acknowledged write was applied to it
            return PartitionIndex(resident.index, resident.documents)
        async with self._lock(key):
            # The snapshot loads while the rows are checked for documents without chunks: what a fill adds is
            # stamped after the snapshot's position, so the replay takes it in either way.
            snapshot, _ = await asyncio.gather(
                asyncio.to_thread(self._indexes.restore, key, space), self._fill_missing(scope, name, key, space)
            )
            return await asyncio.to_thread(self._load, key, space, analysis, snapshot)

    async def _fill_missing(self, scope: Scope, name: str, key: str, space: str) -> None:
        """Chunks and embeds the partition's documents that have no chunks in `space`."""
        for _ in range(3):
            missing = await asyncio.to_thread(self._db.read, lambda c: _missing(c, key, space))
            if not missing:
                return
            prepared = await self._prepare(scope, name, [document_unit(i, t) for i, t in missing])
            if space_of(prepared.model, prepared.analysis) != space:
                return  # the embedder changed meanwhile: the caller loads again with the new one
            metrics.STORE_FILLED_CHUNKS.inc(len(prepared.chunks))
            fill = functools.partial(_fill, key=key, space=space, embedded=missing, prepared=prepared)
            await asyncio.to_thread(self._db.write, fill)

    def _load(self, key: str, space: str, analysis: str, snapshot: HybridIndex | None) -> PartitionIndex:
        """The partition's index from its snapshot and the changes after it, else built from its rows."""
        if snapshot is not None:
            replayed = self._replayed(key, space, snapshot)
            if replayed is not None:
                return replayed
        rows, documents, position = self._db.read(
            lambda c: (_chunk_rows(c, key, space), _documents(c, key), _last_change(c))
        )
        if not rows:
            return PartitionIndex(self._indexes.build([], [], np.zeros((0, 1), np.float32), analysis, 1), documents)
        keys, chunks, vectors = _chunks(rows)
        index = self._indexes.build(keys, chunks, vectors, analysis, vectors.shape[1], position)
        self._indexes.changed(key, Resident(index, space, documents), len(index))
        metrics.INDEX_LOADS.labels("built").inc()
        return PartitionIndex(index, documents)

    def _replayed(self, key: str, space: str, index: HybridIndex) -> PartitionIndex | None:
        """`index`, a snapshot, with the chunks stamped after its position added (replacing their keys) and the
        keys the rows no longer hold removed; None when it cannot be of these rows."""
        since = index.position
        rows, held, documents, position = self._db.read(
            lambda c: (
                _chunk_rows(c, key, space, since),
                _chunk_count(c, key, space),
                _documents(c, key),
                _last_change(c),
            )
        )
        keys, chunks, vectors = _chunks(rows) if rows else ([], [], np.zeros((0, index.dimensions), np.float32))
        if vectors.shape[1] != index.dimensions or since > position:  # since > position: another database's
            return None
        indexed = index.keys()
        # Every row is one the snapshot holds or one written after it: when the rows are as many as those two
        # together, none was removed, and the partition's keys (0.15 s to read at 100k chunks) are not read.
        removed: list[str] = []
        if held != len(indexed) + len(set(keys) - indexed):
            present = self._db.read(lambda c: _chunk_keys(c, key, space))
            removed = [k for k in indexed if k not in present]
        index.update(removed, chunks, vectors, keys, position=position)
        self._indexes.changed(key, Resident(index, space, documents), len(removed) + len(keys))
        return PartitionIndex(index, documents)

    # -- writes -----------------------------------------------------------------------------------------

    async def upsert(self, scope: Scope, name: str, documents: list[MemoryDocument]) -> UpsertOutcome:
        await asyncio.to_thread(check_request_size, documents, self._max_request_bytes)
        key = _key(scope, name)
        async with self._lock(key):
            stored, changed = await asyncio.to_thread(self._changed, key, documents)
            if not changed:
                count = await self.count(scope, name)
                return UpsertOutcome(0, 0, len(documents), count)
            last = None if changed[0].id in stored else await asyncio.to_thread(self._db.read, lambda c: _last(c, key))
            prepared = await self._prepare(scope, name, units_of(changed, last))
            outcome = await asyncio.to_thread(
                self._committed, key, lambda c: self._write(c, key, scope, name, changed, stored, prepared)
            )
        return UpsertOutcome(outcome.inserted, outcome.replaced, len(documents) - len(changed), outcome.count)

    def _changed(
        self, key: str, documents: list[MemoryDocument]
    ) -> tuple[dict[str, MemoryDocument], list[MemoryDocument]]:
        """The stored documents of those ids, and the documents that differ from them (the last of a repeated id)."""
        stored = self._db.read(lambda c: _stored(c, key, [d.id for d in documents]))
        return stored, list({d.id: d for d in documents if stored.get(d.id) != d}.values())

    def _write(
        self,
        connection: sqlite3.Connection,
        key: str,
        scope: Scope,
        name: str,
        changed: list[MemoryDocument],
        stored: dict[str, MemoryDocument],
        prepared: Prepared,
    ) -> tuple[UpsertOutcome, _Change]:
        partition = _partition(connection, key) or _create(connection, key, scope, name)
        change = _next_change(connection)
        space = space_of(prepared.model, prepared.analysis)
        if partition.space != space:  # another embedder's chunks: none of them can answer this space's queries
            connection.execute("DELETE FROM chunks WHERE partition = ?", (partition.id,))
        removed = _remove_chunks(connection, partition.id, [d.id for d in changed])
        seq, now = partition.next_seq, time.time_ns()
        written = {}
        for document in changed:
            if document.id not in stored:
                seq += 1
            created = stored[document.id].created if document.id in stored else now
            written[document.id] = dataclasses.replace(document, created=created, updated=now)
            connection.execute(
                "INSERT INTO documents (partition, id, seq, text, metadata, typed, created, updated, expires) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (partition, id) DO UPDATE SET text = excluded.text, "
                "metadata = excluded.metadata, typed = excluded.typed, updated = excluded.updated, "
                "expires = excluded.expires",
                (
                    partition.id,
                    document.id,
                    seq,
                    document.text,
                    json.dumps(document.metadata, ensure_ascii=False),
                    json.dumps(filters.to_json(document.typed), ensure_ascii=False),
                    created,
                    now,
                    document.expires_at,
                ),
            )
        added = _insert_chunks(connection, partition.id, prepared, change, {i: d.fields() for i, d in written.items()})
        inserted = sum(d.id not in stored for d in changed)
        # The documents' UTF-8 bytes, as the postgres store counts them: one binding_store_bytes means the same.
        grown = sum(d.size() for d in changed) - sum(stored[d.id].size() for d in changed if d.id in stored)
        connection.execute(
            "UPDATE partitions SET documents = documents + ?, bytes = bytes + ?, next_seq = ?, space = ? WHERE id = ?",
            (inserted, grown, seq, space, partition.id),
        )
        if grown > 0:
            self._check_bound(connection)
        outcome = UpsertOutcome(inserted, len(changed) - inserted, 0, partition.documents + inserted)
        return outcome, _Change(space, change, removed, added, rebuild=partition.space != space)

    async def delete(self, scope: Scope, name: str, ids: list[str]) -> DeleteOutcome:
        key = _key(scope, name)
        wanted = list(dict.fromkeys(ids))
        async with self._lock(key):
            outcome = await asyncio.to_thread(self._committed, key, lambda c: _delete(c, key, wanted))
        return outcome

    async def get(self, scope: Scope, name: str, ids: list[str], now: int) -> list[MemoryDocument]:
        wanted = list(dict.fromkeys(ids))
        stored = await asyncio.to_thread(self._db.read, lambda c: _stored(c, _key(scope, name), wanted))
        return [stored[i] for i in wanted if i in stored and not stored[i].expired(now)]

    async def page(self, scope: Scope, name: str, keep: filters.Filter, after: str, limit: int, now: int) -> Page:
        return await asyncio.to_thread(self._db.read, lambda c: _page(c, _key(scope, name), keep, after, limit, now))

    async def delete_matching(self, scope: Scope, name: str, keep: filters.Filter) -> DeleteOutcome:
        key = _key(scope, name)
        async with self._lock(key):
            ids = await asyncio.to_thread(self._db.read, lambda c: _matching(c, key, keep))
            return await asyncio.to_thread(self._committed, key, lambda c: _delete(c, key, ids))

    async def purge(self, now: int) -> int:
        expired = await asyncio.to_thread(self._db.read, lambda c: _expired(c, now))
        purged = 0
        for key, ids in expired.items():
            async with self._lock(key):
                purge = functools.partial(_purge, key=key, ids=ids, now=now)
                outcome = await asyncio.to_thread(self._committed, key, purge)
            purged += outcome.deleted
        return purged

    async def clear(self, scope: Scope, name: str) -> None:
        key = _key(scope, name)
        async with self._lock(key):
            await asyncio.to_thread(self._db.write, lambda c: _clear(c, key))
            self._indexes.forget(key)

    async def drop(self, scope: Scope, name: str) -> None:
        key = _key(scope, name)
        async with self._lock(key):
            await asyncio.to_thread(self._db.write, lambda c: _drop(c, key))
            self._indexes.forget(key)

    def close(self) -> None:
        self._indexes.close()
        self._db.close()

    def _committed(self, key: str, write: Callable[[sqlite3.Connection], tuple[_Outcome, _Change | None]]) -> _Outcome:
        """Commits the write, then applies it to the partition's resident index (one trip off the event loop)."""
        outcome, change = self._db.write(write)
        self._apply(key, change, outcome.count)
        return outcome

    def _apply(self, key: str, change: _Change | None, documents: int) -> None:
        """Applies a committed write to the partition's resident index, if one is held (else the next search
        loads the partition with the write in it)."""
        if change is None:
            return
        resident = self._indexes.get(key, change.space)
        if change.rebuild or resident is None:
            self._indexes.drop(key)
            return
        keys, chunks, vectors = change.added or ([], [], np.zeros((0, resident.index.dimensions), np.float32))
        resident.index.update(change.removed, chunks, vectors, keys, position=change.position)
        resident.documents = documents
        self._indexes.changed(key, resident, len(change.removed) + len(keys))

    def _check_bound(self, connection: sqlite3.Connection) -> None:
        if self._max_bytes is None:
            return
        (total,) = connection.execute("SELECT coalesce(sum(bytes), 0) FROM partitions").fetchone()
        if total > self._max_bytes:
            raise SidecarError(
                ErrorKind.RESOURCE_EXHAUSTED,
                "LIMIT_EXCEEDED",
                "the in-memory knowledge store is full (retrieval.binding_store_bytes); "
                "close or reset bindings, or raise the limit",
            )

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks[hash(key) % _STRIPES]


_Outcome = TypeVar("_Outcome", UpsertOutcome, DeleteOutcome)
_Result = TypeVar("_Result")


@dataclass(frozen=True)
class _Change:
    """What a committed write (the store's change `position`) changed in a space: chunk keys removed, and
    (keys, chunks, vectors) added."""

    space: str
    position: int
    removed: list[str]
    added: tuple[list[str], list[IndexedChunk], np.ndarray] | None
    rebuild: bool = False


class _Database:
    """One SQLite connection, used by one thread at a time (writes and reads are short)."""

    def __init__(self, path: Path | None) -> None:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._connection = sqlite3.connect(
            ":memory:" if path is None else str(path), check_same_thread=False, isolation_level=None
        )
        self._lock = threading.Lock()
        with self._lock:
            if path is not None:
                self._connection.execute("PRAGMA journal_mode = WAL")
            # Every acknowledged write is on disk: the commit waits for the WAL's fsync.
            self._connection.execute("PRAGMA synchronous = FULL")
            with _transaction(self._connection):
                (version,) = self._connection.execute("PRAGMA user_version").fetchone()
                if version == 1:
                    for statement in _UPGRADE_1:
                        self._connection.execute(statement)
                if version in (1, 2):
                    for statement in _UPGRADE_2:
                        self._connection.execute(statement, {"now": time.time_ns()})
                for statement in (*_SCHEMA.split(";\n"), _CHANGED_INDEX):  # executescript would commit
                    if statement.strip():
                        self._connection.execute(statement)
                self._connection.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")

    def read(self, work: Callable[[sqlite3.Connection], _Result]) -> _Result:
        with self._lock:
            return work(self._connection)

    def write(self, work: Callable[[sqlite3.Connection], _Result]) -> _Result:
        with self._lock, _transaction(self._connection):
            return work(self._connection)

    def close(self) -> None:
        with self._lock:
            self._connection.close()


@contextmanager
def _transaction(connection: sqlite3.Connection) -> Iterator[None]:
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


# -- statements -------------------------------------------------------------------------------------------


def _key(scope: Scope, name: str) -> str:
    return key_of(scope.tenant, scope.session, name)


def _partition(connection: sqlite3.Connection, key: str) -> _Partition | None:
    row = connection.execute("SELECT id, documents, next_seq, space FROM partitions WHERE key = ?", (key,)).fetchone()
    return None if row is None else _Partition(*row)


def _create(connection: sqlite3.Connection, key: str, scope: Scope, name: str) -> _Partition:
    cursor = connection.execute(
        "INSERT INTO partitions (key, tenant, session, source) VALUES (?, ?, ?, ?)",
        (key, scope.tenant, scope.session, name),
    )
    return _Partition(int(cursor.lastrowid or 0), 0, 0, "")


def _documents(connection: sqlite3.Connection, key: str) -> int:
    partition = _partition(connection, key)
    return 0 if partition is None else partition.documents


def _stored(connection: sqlite3.Connection, key: str, ids: list[str]) -> dict[str, MemoryDocument]:
    partition = _partition(connection, key)
    if partition is None:
        return {}
    found = {}
    for start in range(0, len(ids), 500):  # SQLite's bound on parameters per statement
        batch = ids[start : start + 500]
        marks = ",".join("?" * len(batch))
        for row in connection.execute(
            f"SELECT {_DOCUMENT} FROM documents d WHERE d.partition = ? AND d.id IN ({marks})", (partition.id, *batch)
        ):
            document = _document(row)
            found[document.id] = document
    return found


def _last(connection: sqlite3.Connection, key: str) -> MemoryDocument | None:
    """The partition's latest document (what a new one is written after), None when it holds none."""
    row = connection.execute(
        f"SELECT {_DOCUMENT} FROM documents d JOIN partitions p ON p.id = d.partition WHERE p.key = ? "
        "ORDER BY d.seq DESC LIMIT 1",
        (key,),
    ).fetchone()
    return None if row is None else _document(row)


def _document(row: tuple) -> MemoryDocument:
    """A document of its row's _DOCUMENT columns."""
    i, text, metadata, typed, expires, created, updated = row
    return MemoryDocument(
        i, text, json.loads(metadata), filters.from_json(json.loads(typed)), expires, created=created, updated=updated
    )


def _remove_chunks(connection: sqlite3.Connection, partition: int, documents: list[str]) -> list[str]:
    """Deletes the documents' chunks; returns their keys."""
    keys: list[str] = []
    for start in range(0, len(documents), 500):
        batch = documents[start : start + 500]
        marks = ",".join("?" * len(batch))
        keys += [
            k
            for (k,) in connection.execute(
                f"DELETE FROM chunks WHERE partition = ? AND document IN ({marks}) RETURNING key", (partition, *batch)
            )
        ]
    return keys


def _insert_chunks(
    connection: sqlite3.Connection,
    partition: int,
    prepared: Prepared,
    change: int,
    fields: dict[str, dict[str, filters.Value]] | None = None,
) -> tuple[list[str], list[IndexedChunk], np.ndarray] | None:
    """Stores the prepared chunks; returns them as the index holds them, with their documents' `fields` (the
    rows keep no fields: a load joins them from the documents)."""
    if not prepared.chunks:
        return None
    keys = chunk_keys(prepared.chunks)
    chunks = [indexed(c) for c in prepared.chunks]
    vectors = np.ascontiguousarray(prepared.vectors, dtype=_VECTOR)
    connection.executemany(
        "INSERT OR REPLACE INTO chunks (partition, key, document, id, text, meta, vector, changed) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                partition,
                key,
                c.provenance.document_id,
                i.id,
                i.text,
                json.dumps(i.meta, ensure_ascii=False),
                vector.tobytes(),
                change,
            )
            for key, c, i, vector in zip(keys, prepared.chunks, chunks, vectors, strict=True)
        ],
    )
    if fields is not None:
        chunks = [with_fields(c, fields[c.meta["document_id"]]) for c in chunks]
    return keys, chunks, vectors


def _chunk_rows(connection: sqlite3.Connection, key: str, space: str, since: int = -1) -> list[tuple]:
    """The chunks of the partition in `space` written after change `since` (all by default), in document order."""
    return connection.execute(
        f"SELECT c.key, c.id, c.text, c.meta, c.vector, {_DOCUMENT} FROM chunks c "
        "JOIN partitions p ON p.id = c.partition JOIN documents d ON d.partition = c.partition AND d.id = c.document "
        "WHERE p.key = ? AND p.space = ? AND c.changed > ? ORDER BY d.seq, c.key",
        (key, space, since),
    ).fetchall()


def _chunk_keys(connection: sqlite3.Connection, key: str, space: str) -> set[str]:
    return {
        k
        for (k,) in connection.execute(
            "SELECT c.key FROM chunks c JOIN partitions p ON p.id = c.partition WHERE p.key = ? AND p.space = ?",
            (key, space),
        )
    }


def _chunk_count(connection: sqlite3.Connection, key: str, space: str) -> int:
    """The partition's chunks in `space`: counted on an index, no row read."""
    (count,) = connection.execute(
        "SELECT count(*) FROM chunks c JOIN partitions p ON p.id = c.partition WHERE p.key = ? AND p.space = ?",
        (key, space),
    ).fetchone()
    return int(count)


def _chunks(rows: list[tuple]) -> tuple[list[str], list[IndexedChunk], np.ndarray]:
    """(key, id, text, meta, vector, *document) rows as keys, chunks (with their document's fields) and their
    float32 vectors."""
    vectors = np.stack([np.frombuffer(r[4], dtype=_VECTOR) for r in rows])
    fields: dict[str, dict[str, filters.Value]] = {}
    chunks = []
    for r in rows:
        document = r[5]
        if document not in fields:
            fields[document] = _document(r[5:]).fields()
        chunks.append(with_fields(IndexedChunk(r[1], r[2], json.loads(r[3])), fields[document]))
    return [r[0] for r in rows], chunks, vectors


def _next_change(connection: sqlite3.Connection) -> int:
    """Draws the store's next change number (inside the write's transaction: a rolled back write draws none)."""
    (change,) = connection.execute("UPDATE changes SET last = last + 1 WHERE id = 0 RETURNING last").fetchone()
    return int(change)


def _last_change(connection: sqlite3.Connection) -> int:
    (change,) = connection.execute("SELECT last FROM changes WHERE id = 0").fetchone()
    return int(change)


def _missing(connection: sqlite3.Connection, key: str, space: str) -> list[tuple[str, str]]:
    """Documents with no chunk in the space (all of them when the partition's chunks are of another space)."""
    partition = _partition(connection, key)
    if partition is None:
        return []
    if partition.space != space:
        return connection.execute(
            "SELECT id, text FROM documents WHERE partition = ? ORDER BY seq", (partition.id,)
        ).fetchall()
    # Chunks belong to documents the partition holds, so when as many documents have chunks as it holds, none is
    # missing: counted on an index (0.05 s at 100k documents, against 0.19 to 0.25 s for the search below).
    (covered,) = connection.execute(
        "SELECT count(DISTINCT document) FROM chunks WHERE partition = ?", (partition.id,)
    ).fetchone()
    if covered == partition.documents:
        return []
    # The ids from the two indexes alone, then the texts of those only: a document's row holds its text, and reading
    # every row to find none missing cost 2.4 s of a partition's open at 100k documents (0.25 s this way).
    missing = connection.execute(
        "SELECT d.id FROM documents d WHERE d.partition = ? AND NOT EXISTS "
        "(SELECT 1 FROM chunks c WHERE c.partition = d.partition AND c.document = d.id) ORDER BY d.seq",
        (partition.id,),
    ).fetchall()
    return [
        (
            document,
            connection.execute(
                "SELECT text FROM documents WHERE partition = ? AND id = ?", (partition.id, document)
            ).fetchone()[0],
        )
        for (document,) in missing
    ]


def _fill(
    connection: sqlite3.Connection, key: str, space: str, embedded: list[tuple[str, str]], prepared: Prepared
) -> None:
    """Gives the embedded documents their chunks in `space` (the partition's chunks of any other space go)."""
    partition = _partition(connection, key)
    if partition is None:
        return
    if partition.space != space:
        connection.execute("DELETE FROM chunks WHERE partition = ?", (partition.id,))
        connection.execute("UPDATE partitions SET space = ? WHERE id = ?", (space, partition.id))
    _remove_chunks(connection, partition.id, [i for i, _ in embedded])
    _insert_chunks(connection, partition.id, prepared, _next_change(connection))


def _delete(connection: sqlite3.Connection, key: str, ids: list[str]) -> tuple[DeleteOutcome, _Change | None]:
    partition = _partition(connection, key)
    if partition is None:
        return DeleteOutcome(0, len(ids), 0), None
    change = _next_change(connection)
    stored = _stored(connection, key, ids)
    removed = _remove_chunks(connection, partition.id, list(stored))
    for document in stored.values():
        connection.execute("DELETE FROM documents WHERE partition = ? AND id = ?", (partition.id, document.id))
    shrunk = sum(d.size() for d in stored.values())
    connection.execute(
        "UPDATE partitions SET documents = documents - ?, bytes = bytes - ? WHERE id = ?",
        (len(stored), shrunk, partition.id),
    )
    outcome = DeleteOutcome(len(stored), len(ids) - len(stored), partition.documents - len(stored))
    return outcome, _Change(partition.space, change, removed, None) if stored else None


def _page(connection: sqlite3.Connection, key: str, keep: filters.Filter, after: str, limit: int, now: int) -> Page:
    partition = _partition(connection, key)
    if partition is None:
        return Page([], None)
    rows = connection.execute(
        f"SELECT {_DOCUMENT} FROM documents d WHERE d.partition = ? AND d.id > ? ORDER BY d.id LIMIT ?",
        (partition.id, after, LIST_SCAN_BOUND),
    ).fetchall()
    return page_of([_document(row) for row in rows], keep, now, limit)


def _matching(connection: sqlite3.Connection, key: str, keep: filters.Filter) -> list[str]:
    partition = _partition(connection, key)
    if partition is None:
        return []
    rows = connection.execute(f"SELECT {_DOCUMENT} FROM documents d WHERE d.partition = ?", (partition.id,))
    return [d.id for d in map(_document, rows) if filters.matches(keep, d.fields())]


def _expired(connection: sqlite3.Connection, now: int) -> dict[str, list[str]]:
    """Up to PURGE_BOUND expired documents' ids, by partition key."""
    found: dict[str, list[str]] = {}
    for key, document in connection.execute(
        "SELECT p.key, d.id FROM documents d JOIN partitions p ON p.id = d.partition "
        "WHERE d.expires IS NOT NULL AND d.expires <= ? LIMIT ?",
        (now, PURGE_BOUND),
    ):
        found.setdefault(key, []).append(document)
    return found


def _purge(connection: sqlite3.Connection, key: str, ids: list[str], now: int) -> tuple[DeleteOutcome, _Change | None]:
    """Deletes those of `ids` still expired at `now` (a write may have renewed one since they were found)."""
    return _delete(connection, key, [i for i, d in _stored(connection, key, ids).items() if d.expired(now)])


def _clear(connection: sqlite3.Connection, key: str) -> None:
    partition = _partition(connection, key)
    if partition is not None:
        for table in ("chunks", "documents"):
            connection.execute(f"DELETE FROM {table} WHERE partition = ?", (partition.id,))
        connection.execute("UPDATE partitions SET documents = 0, bytes = 0 WHERE id = ?", (partition.id,))


def _drop(connection: sqlite3.Connection, key: str) -> None:
    _clear(connection, key)
    connection.execute("DELETE FROM partitions WHERE key = ?", (key,))


# -- 0.2.0's partition files ------------------------------------------------------------------------------


def migrate_partition_files(folder: Path, store_path: Path) -> int:
    """Imports the JSON partition files 0.2.0 (and earlier) wrote under `folder` into the SQLite database at
    `store_path`, one transaction per file, then removes each file; returns how many were imported. A file whose
    partition the database already holds was imported before a crash stopped its removal: it is removed. The
    documents get their chunks on the partition's first search (they are embedded then, as at 0.2.0's first
    search after a restart). An unreadable file is left as it is, with a warning."""
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        return 0
    database = _Database(store_path)
    imported = 0
    try:
        for file in files:
            try:
                body = json.loads(file.read_text(encoding="utf-8"))
                scope, name = Scope(body["tenant"], body["session"]), body["source"]
                documents = [MemoryDocument(r["id"], r["text"], r.get("metadata", {})) for r in body["documents"]]
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning("MEMORY partition file %s is unreadable (%s); left as it is", file, err)
                continue
            imported += database.write(
                functools.partial(_import, key=_key(scope, name), scope=scope, name=name, documents=documents)
            )
            file.unlink()
    finally:
        database.close()
    with contextlib.suppress(OSError):  # emptied: 0.2.0's folder is of no further use (kept if anything is left)
        folder.rmdir()
    log.info("imported %d MEMORY partition files of an earlier version into %s", imported, store_path.name)
    return imported


def _import(connection: sqlite3.Connection, key: str, scope: Scope, name: str, documents: list[MemoryDocument]) -> int:
    if _partition(connection, key) is not None:
        return 0
    partition = _create(connection, key, scope, name)
    now = time.time_ns()
    connection.executemany(
        "INSERT INTO documents (partition, id, seq, text, metadata, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (partition.id, d.id, seq, d.text, json.dumps(d.metadata, ensure_ascii=False), now, now)
            for seq, d in enumerate(documents, 1)
        ],
    )
    size = sum(d.size() for d in documents)
    connection.execute(
        "UPDATE partitions SET documents = ?, bytes = ?, next_seq = ? WHERE id = ?",
        (len(documents), size, len(documents), partition.id),
    )
    return 1


# -- bindings and cursors: this process's memory ----------------------------------------------------------


class InMemoryRegistry:
    """This process's open bindings: an OrderedDict, least recently used first."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._open: OrderedDict[str, Binding] = OrderedDict()
        self._used: dict[str, float] = {}

    async def add(self, binding: Binding, max_open: int) -> list[Binding]:
        evicted = []
        while len(self._open) >= max_open:
            evicted.append(self._pop(next(iter(self._open))))
        self._open[binding.id] = binding
        await self.use(binding)
        return evicted

    async def find(self, binding_id: str, tenant: str) -> Binding | None:
        return self._open.get(binding_id)

    async def use(self, binding: Binding) -> None:
        self._open.move_to_end(binding.id)
        self._used[binding.id] = self._clock()

    async def remove(self, binding: Binding) -> bool:
        if binding.id not in self._open:
            return False
        self._pop(binding.id)
        return True

    async def remove_idle(self, idle_seconds: float) -> list[Binding]:
        """The oldest uses come first, so this stops at the first binding still in use (the cost is the
        number closed)."""
        oldest_allowed, idle = self._clock() - idle_seconds, []
        while self._open:
            binding_id = next(iter(self._open))
            if self._used[binding_id] > oldest_allowed:
                break
            idle.append(self._pop(binding_id))
        return idle

    async def count(self) -> int:
        return len(self._open)

    def _pop(self, binding_id: str) -> Binding:
        del self._used[binding_id]
        return self._open.pop(binding_id)


class InMemoryPositions:
    """This process's SEQUENTIAL cursors, least recently used first."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._positions: OrderedDict[str, int] = OrderedDict()
        metrics.SEQUENTIAL_CURSORS.set_function(lambda: len(self._positions))

    async def take(self, key: str, tenant: str, units: int) -> int | None:
        position = self._positions.get(key, 0)
        if position >= units:
            return None
        self._positions[key] = position + 1
        self._positions.move_to_end(key)
        while len(self._positions) > self._limit:
            self._positions.popitem(last=False)
        return position


class EmbeddedBackend:
    name = "embedded"
    healthy = True

    def __init__(
        self,
        data_dir: Path,
        memory_cache_bytes: int,
        binding_store_bytes: int,
        max_request_bytes: int,
        index_threads: int,
        index_dtype: str,
        snapshots: SnapshotPolicy | None = None,
    ) -> None:
        """`snapshots`: when MEMORY partitions' indexes are saved under `data_dir/snapshots/memory` (None: never)."""
        self._path = data_dir / "memory.sqlite3"
        self._snapshots = snapshots
        self._snapshot_dir = data_dir / "snapshots" / "memory"
        self._memory_cache_bytes = memory_cache_bytes
        self._binding_store_bytes = binding_store_bytes
        self._max_request_bytes = max_request_bytes
        self._index = (index_threads, index_dtype)
        self._stores: list[EmbeddedDocuments] = []
        migrate_partition_files(data_dir / "memory", self._path)

    def on_health_change(self, callback: Callable[[bool], None]) -> None:
        return None  # always healthy

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        for store in self._stores:
            await asyncio.to_thread(store.close)  # waits for a snapshot in flight

    def documents(self, namespace: str, prepare: Prepare) -> EmbeddedDocuments:
        memory = namespace == "memory"
        # Binding corpora live in memory (lost on restart): snapshots of them would outlive their rows.
        snapshots = (
            PartitionSnapshots(self._snapshot_dir, self._index[0], self._snapshots)
            if memory and self._snapshots is not None
            else None
        )
        indexes = ResidentIndexes(f"{namespace}_indexes", self._memory_cache_bytes, *self._index, snapshots)
        store = EmbeddedDocuments(
            self._path if memory else None,
            prepare,
            indexes,
            name="memory_partitions" if memory else "binding_corpora",
            max_request_bytes=self._max_request_bytes,
            max_bytes=None if memory else self._binding_store_bytes,
        )
        self._stores.append(store)
        return store

    def binding_registry(self, clock: Callable[[], float] = time.monotonic) -> InMemoryRegistry:
        return InMemoryRegistry(clock)

    def cursor_positions(self, limit: int) -> InMemoryPositions:
        return InMemoryPositions(limit)

    def vector_cache(self) -> LocalVectors:
        return LocalVectors()
