"""MEMORY documents and chat bindings' corpora in PostgreSQL, shared by every replica (`[store] backend = "postgres"`):
the postgres backend's DocumentStore (knowledge/storage.py).

PostgreSQL is the source of truth (the tables of migrations 0002, 0005 and 0006): documents, and their chunks
with float32 vectors. A partition is one (namespace, tenant, session, source), found by `key_of(namespace,
tenant, session, source)`: "memory" partitions hold UpsertDocuments' documents, "binding" ones chat bindings'
corpora, so no choice of ids makes two share rows. Every statement also filters on the tenant, and runs with it
set for the row-level security policies.

Writes: documents are chunked and embedded BEFORE the transaction (off the event loop, by the catalog, whose
embedding cache makes unchanged texts free); then one transaction locks the partition's row (writes of one
partition are serialised, on every replica), draws the partition's next change, writes documents and chunks
stamped with it, and logs the keys of the chunks it removes under it. The call returns only after the commit,
so an acknowledged write is durable and in every replica's next search; a replica killed mid-write leaves a
transaction that PostgreSQL rolls back, with nothing half-written and no file to sweep.

Searches run on a resident incremental index per partition (store/resident.py, an LRU bounded in bytes).
Before answering, `index` asks one cheap query: the partition's latest change, its document count and its
space's state. An index caught up to that change answers at once; one behind applies the changes after its
position (the removed keys, then the chunks added, with their vectors), read in one statement and so from one
snapshot; with no index held, the replica's own snapshot of the partition (store/snapshots.py, under its
`data_dir/snapshots`) is loaded and caught up the same way; with none, or one older than its space's change log
reaches back, the snapshot another replica shared through the database (store/shared_snapshots.py), if newer, is
downloaded in place of its own and loaded the same way; failing that, the space is loaded whole.

The change log stays bounded: each space keeps at most `change_log_entries` removed keys, whole changes at a
time; the write that logs past that prunes the oldest changes and moves the space's `log_from` past them. An
index older than that reloads its space, which costs about what catching up on that many changes would.

Chunks live in a "space" per (model fingerprint, lexical analysis): a write fills the space of the current
embedder and drops the changed documents' chunks from every space, so another embedder's space lacks them; it
is filled in (the missing documents chunked and embedded) when a replica with that model next searches it.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import shutil
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types.json import Jsonb

from ragsidecar import metrics
from ragsidecar.errors import ErrorKind, SidecarError
from ragsidecar.identifiers import key_of
from ragsidecar.knowledge import filters
from ragsidecar.knowledge.chunking import Chunk, chunk_meta
from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk
from ragsidecar.knowledge.sources.units import Unit
from ragsidecar.knowledge.storage import (
    LIST_SCAN_BOUND,
    PURGE_BOUND,
    DeleteOutcome,
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
from ragsidecar.store import shared_snapshots
from ragsidecar.store.cursors import across_tenants
from ragsidecar.store.database import one_row
from ragsidecar.store.resident import Resident, ResidentIndexes, chunk_keys

if TYPE_CHECKING:
    from ragsidecar.store.database import Database

# Fill-ins of a space raced by writes of other replicas before a search gives up and serves what is there.
_FILL_ATTEMPTS = 3
# Removed chunk keys a space's change log keeps: a replica further behind reloads the space.
CHANGE_LOG_ENTRIES = 10_000
# Seconds between a replica's counts of the whole change log (ragsidecar_store_change_log_entries).
_LOG_COUNT_EVERY_S = 60.0
# Locks per store serialising the catch-ups of one partition (a partition maps to one of them).
_STRIPES = 64


@dataclass(frozen=True)
class PartitionKey:
    namespace: str  # "memory" or "binding"
    tenant: str
    session: str
    source: str

    @property
    def key(self) -> str:
        return key_of(self.namespace, self.tenant, self.session, self.source)


class PostgresMemoryStore:
    def __init__(
        self,
        database: Database,
        *,
        namespace: str,
        prepare: Prepare,
        indexes: ResidentIndexes,
        max_request_bytes: int,
        max_namespace_bytes: int | None = None,
        change_log_entries: int = CHANGE_LOG_ENTRIES,
        shared_snapshots: bool = False,
    ) -> None:
        """`max_namespace_bytes` bounds the bytes of all the namespace's partitions together, in the whole database
        (the binding corpora: retrieval.binding_store_bytes); None leaves it unbounded (MEMORY lives on disk).
        `shared_snapshots`: a partition with no usable snapshot of this replica's own loads the one shared through
        the database, if any."""
        self._shared_snapshots = shared_snapshots
        self._database = database
        self._namespace = namespace
        self._prepare = prepare
        self._indexes = indexes
        self._max_request_bytes = max_request_bytes
        self._max_namespace_bytes = max_namespace_bytes
        self._log_entries = change_log_entries
        self._log_counted = -float("inf")
        self._locks = [asyncio.Lock() for _ in range(_STRIPES)]

    def partition(self, scope: Scope, name: str) -> PartitionKey:
        return PartitionKey(self._namespace, scope.tenant, scope.session, name)

    # -- reads ------------------------------------------------------------------------------------------

    async def units(self, scope: Scope, name: str) -> list[Unit]:
        key = self.partition(scope, name)
        rows = await self._database.run(lambda c: _documents(c, key), tenant=key.tenant)
        return [document_unit(document_id, text) for document_id, text in rows]

    async def count(self, scope: Scope, name: str) -> int:
        key = self.partition(scope, name)
        partition = await self._database.run(lambda c: _partition_row(c, key), tenant=key.tenant)
        return 0 if partition is None else partition.documents

    async def index(self, scope: Scope, name: str, model: str, analysis: str) -> PartitionIndex:
        """The partition's resident index of this model's and analysis' space, caught up with the database."""
        key = self.partition(scope, name)
        state = await self._filled_state(scope, name, key, model, analysis)
        if state.space is None:
            return PartitionIndex(self._indexes.build([], [], _NO_VECTORS, analysis, 1), state.documents)
        label = str(state.space)  # space ids are never reused: a dropped and re-created partition is a new one
        resident = self._indexes.get(key.key, label)
        if resident is None or resident.position < state.changes:
            async with self._locks[hash(key.key) % _STRIPES]:
                resident = self._indexes.get(key.key, label)  # another search may have caught up meanwhile
                if resident is None or resident.position < state.changes:
                    resident = await self._catch_up(key, state, label, resident, analysis)
        return PartitionIndex(resident.index, resident.documents)

    async def _filled_state(self, scope: Scope, name: str, key: PartitionKey, model: str, analysis: str) -> _SpaceState:
        """The partition's and the space's state (one query), after filling in the documents the space lacks."""
        for attempt in range(_FILL_ATTEMPTS + 1):
            state = await self._database.run(lambda c: _space_state(c, key, model, analysis), tenant=key.tenant)
            if state.complete or attempt == _FILL_ATTEMPTS:
                break
            missing = await self._database.run(
                functools.partial(_missing_documents, tenant=key.tenant, partition=state.partition, space=state.space),
                tenant=key.tenant,
            )
            prepared = await self._prepare(scope, name, [document_unit(i, text) for i, text in missing])
            if (prepared.model, prepared.analysis) != (model, analysis):
                break  # the embedder changed meanwhile: the caller loads again with the new one
            metrics.STORE_FILLED_CHUNKS.inc(len(prepared.chunks))
            fill = functools.partial(_fill, key=key, embedded=missing, prepared=prepared)
            await self._database.run(fill, tenant=key.tenant)
        return state

    async def _catch_up(
        self, key: PartitionKey, state: _SpaceState, label: str, resident: Resident | None, analysis: str
    ) -> Resident:
        """The resident index brought up to date: from the change log when it reaches back far enough, else
        loaded whole."""
        space = state.space
        assert space is not None
        if resident is None:  # this replica's snapshot, or the one shared, then the changes after it
            snapshot = await self._snapshot(key, state, label)
            if snapshot is not None:
                resident = Resident(snapshot, label, state.documents, snapshot.position)
        if resident is not None and resident.position >= state.log_from:
            since = resident.position
            delta = await self._database.run(lambda c: _changes_since(c, key.tenant, space, since), tenant=key.tenant)
            if delta is not None and await asyncio.to_thread(_apply, resident, delta):
                self._indexes.changed(key.key, resident, len(delta.removed) + len(delta.added[0]))
                metrics.PARTITION_CATCH_UPS.labels("changes").inc()
                return resident
        loaded = await self._database.run(lambda c: _space_chunks(c, key.tenant, space), tenant=key.tenant)
        resident = await asyncio.to_thread(self._build, label, loaded, analysis)
        self._indexes.changed(key.key, resident, len(resident.index))
        metrics.PARTITION_CATCH_UPS.labels("reload").inc()
        return resident

    async def _snapshot(self, key: PartitionKey, state: _SpaceState, label: str) -> HybridIndex | None:
        """This replica's snapshot of the space; when it has none, or one the change log no longer reaches back to,
        the snapshot shared through the database if that is newer. None when neither can be used."""
        snapshot = await asyncio.to_thread(self._indexes.restore, key.key, label)
        if snapshot is not None and snapshot.position > state.changes:  # past the partition: of another database
            snapshot = None
        if not self._shared_snapshots or (snapshot is not None and snapshot.position >= state.log_from):
            return snapshot
        after = state.log_from - 1 if snapshot is None else max(snapshot.position, state.log_from - 1)
        if not await self._fetch_shared(key, state, after):
            return snapshot
        fetched = await asyncio.to_thread(self._indexes.restore, key.key, label)
        return snapshot if fetched is None else fetched

    async def _fetch_shared(self, key: PartitionKey, state: _SpaceState, after: int) -> bool:
        """Downloads the space's shared snapshot, when its position is past `after`, in place of this replica's own;
        False when there is none such (or this replica keeps no snapshots) or what was read is torn."""
        space = state.space
        assert space is not None
        incoming = await asyncio.to_thread(self._indexes.incoming, key.key)
        if incoming is None:
            return False

        def fetch(connection: psycopg.Connection) -> bool:
            return shared_snapshots.download(connection, key.tenant, space, after, state.changes, incoming)

        try:
            if not await self._database.run(fetch, tenant=key.tenant):
                return False
            await asyncio.to_thread(self._indexes.adopt, key.key, incoming)
        finally:  # gone once adopted; else what a torn or failed download left
            await asyncio.to_thread(shutil.rmtree, incoming, True)
        metrics.INDEX_SNAPSHOTS.labels("fetched").inc()
        return True

    def _build(self, label: str, loaded: _Changes, analysis: str) -> Resident:
        keys, chunks, vectors = loaded.added
        index = self._indexes.build(keys, chunks, vectors, analysis, vectors.shape[1], loaded.position)
        return Resident(index, label, loaded.documents, loaded.position)

    # -- writes -----------------------------------------------------------------------------------------

    async def upsert(self, scope: Scope, name: str, documents: list[MemoryDocument]) -> UpsertOutcome:
        check_request_size(documents, self._max_request_bytes)
        documents = list({d.id: d for d in documents}.values())  # one id twice: the last one stands
        key = self.partition(scope, name)
        last = await self._database.run(lambda c: _last(c, key), tenant=key.tenant)
        # A first document that replaces one is not written after the latest (best effort: a concurrent
        # write may come between this read and the write's transaction).
        last = None if last is None or last.id in {d.id for d in documents} else last
        prepared = await self._prepare(scope, name, units_of(documents, last))
        outcome, logged = await self._database.run(
            lambda c: write(c, key, documents, prepared, self._max_namespace_bytes, self._log_entries),
            tenant=key.tenant,
        )
        await self._count_log(logged)
        return outcome

    async def delete(self, scope: Scope, name: str, ids: list[str]) -> DeleteOutcome:
        key = self.partition(scope, name)
        outcome, logged = await self._database.run(
            lambda c: _delete(c, key, list(dict.fromkeys(ids)), self._log_entries), tenant=key.tenant
        )
        await self._count_log(logged)
        return outcome

    async def get(self, scope: Scope, name: str, ids: list[str], now: int) -> list[MemoryDocument]:
        key = self.partition(scope, name)
        wanted = list(dict.fromkeys(ids))
        stored = await self._database.run(lambda c: _stored_in(c, key, wanted), tenant=key.tenant)
        return [stored[i] for i in wanted if i in stored and not stored[i].expired(now)]

    async def page(self, scope: Scope, name: str, keep: filters.Filter, after: str, limit: int, now: int) -> Page:
        key = self.partition(scope, name)
        return await self._database.run(lambda c: _page(c, key, keep, after, limit, now), tenant=key.tenant)

    async def delete_matching(self, scope: Scope, name: str, keep: filters.Filter) -> DeleteOutcome:
        key = self.partition(scope, name)

        def delete(connection: psycopg.Connection) -> tuple[DeleteOutcome, int]:
            return _delete(connection, key, _matching(connection, key, keep), self._log_entries)

        outcome, logged = await self._database.run(delete, tenant=key.tenant)
        await self._count_log(logged)
        return outcome

    async def purge(self, now: int) -> int:
        expired = await self._database.run(lambda c: _expired(c, self._namespace, now))
        purged = 0
        for key, ids in expired.items():
            purge = functools.partial(_purge, key=key, ids=ids, now=now, log_entries=self._log_entries)
            outcome, logged = await self._database.run(purge, tenant=key.tenant)
            await self._count_log(logged)
            purged += outcome.deleted
        return purged

    async def clear(self, scope: Scope, name: str) -> None:
        """Empties the partition: every replica's index of it reloads (an empty space) on its next search."""
        key = self.partition(scope, name)
        await self._database.run(lambda c: _clear(c, key), tenant=key.tenant)
        self._indexes.forget(key.key)

    async def drop(self, scope: Scope, name: str) -> None:
        """Forgets the partition entirely (a closed chat binding)."""
        key = self.partition(scope, name)
        await self._database.run(lambda c: _drop(c, key), tenant=key.tenant)
        self._indexes.forget(key.key)

    def sweep(self) -> tuple[int, int]:
        """Nothing to sweep: a write killed mid-way is a transaction PostgreSQL rolled back."""
        return 0, 0

    async def _count_log(self, logged: int) -> None:
        """Counts the whole change log for its gauge, at most once a minute, after a write that logged removals."""
        now = time.monotonic()
        if logged and now - self._log_counted >= _LOG_COUNT_EVERY_S:
            self._log_counted = now
            metrics.STORE_CHANGE_LOG_ENTRIES.set(await self._database.run(_change_log_size))


# -- the write transaction (also the bulk-load path of benchmarks, with vectors of their own) ----------------------


def write(
    connection: psycopg.Connection,
    key: PartitionKey,
    documents: list[MemoryDocument],
    prepared: Prepared,
    max_namespace_bytes: int | None = None,
    change_log_entries: int = CHANGE_LOG_ENTRIES,
) -> tuple[UpsertOutcome, int]:
    """Upserts `documents` (their chunks and vectors in `prepared`) into the partition, inside the caller's
    transaction (run it with the tenant set: `Database.run`); unchanged documents (same text and metadata) are
    left as they are. Returns the outcome and how many removed chunk keys it logged. A write that would take the
    namespace's partitions past `max_namespace_bytes` raises RESOURCE_EXHAUSTED (the transaction rolls back:
    nothing of it stays)."""
    partition = _lock_partition(connection, key)
    stored = _stored(connection, key.tenant, partition.id, [d.id for d in documents])
    changed = [d for d in documents if stored.get(d.id) != d]
    if not changed:
        return UpsertOutcome(0, 0, len(documents), partition.documents), 0
    change, now = partition.changes + 1, time.time_ns()
    written = {d.id: replace(d, created=stored[d.id].created if d.id in stored else now, updated=now) for d in changed}
    connection.cursor().executemany(
        "INSERT INTO ragsidecar_memory_documents (partition, id, tenant, text, metadata, typed, created, updated, "
        "expires) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (partition, id) DO UPDATE SET "
        "text = EXCLUDED.text, metadata = EXCLUDED.metadata, typed = EXCLUDED.typed, updated = EXCLUDED.updated, "
        "expires = EXCLUDED.expires",
        [
            (
                partition.id,
                d.id,
                key.tenant,
                d.text,
                Jsonb(d.metadata),
                Jsonb(filters.to_json(d.typed)),
                d.created,
                d.updated,
                d.expires_at,
            )
            for d in written.values()
        ],
    )
    removed = _remove_chunks(connection, key.tenant, partition.id, [d.id for d in changed], change)
    # A space new to a partition that already has documents lacks theirs: it is filled in on a search.
    space = _own_space(
        connection, key.tenant, partition.id, prepared, filled_at=partition.changes if partition.documents == 0 else -1
    )
    ids = {d.id for d in changed}
    _insert_chunks(
        connection,
        key,
        space,
        [(c, v) for c, v in zip(prepared.chunks, prepared.vectors, strict=True) if c.provenance.document_id in ids],
        change,
        {i: d.fields() for i, d in written.items()},
    )
    replaced = sum(d.id in stored for d in changed)
    grown = sum(d.size() for d in changed) - sum(stored[d.id].size() for d in changed if d.id in stored)
    # Only the writer's own space still holds every document (the changed ones' chunks left the others).
    _advance(
        connection,
        key.tenant,
        partition,
        change,
        partition.documents + len(changed) - replaced,
        grown,
        only_space=space,
    )
    if max_namespace_bytes is not None and grown > 0:
        _check_namespace_bytes(connection, key.namespace, max_namespace_bytes)
    logged = _log_removals(connection, key.tenant, removed, change_log_entries)
    return UpsertOutcome(
        len(changed) - replaced, replaced, len(documents) - len(changed), partition.documents + len(changed) - replaced
    ), logged


@dataclass(frozen=True)
class _Partition:
    id: int
    changes: int  # the partition's latest change
    documents: int


def _lock_partition(connection: psycopg.Connection, key: PartitionKey) -> _Partition:
    """The partition, created when new, its row locked until the transaction ends."""
    return _Partition(
        *one_row(
            connection,
            "INSERT INTO ragsidecar_memory_partitions (key, tenant, namespace, session, source) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key) "
            "DO UPDATE SET changes = ragsidecar_memory_partitions.changes RETURNING id, changes, documents",
            (key.key, key.tenant, key.namespace, key.session, key.source),
        )
    )


def _own_space(connection: psycopg.Connection, tenant: str, partition: int, prepared: Prepared, filled_at: int) -> int:
    """The space the chunks go to; created (with `filled_at`) when new."""
    connection.execute(
        "INSERT INTO ragsidecar_memory_spaces (partition, tenant, model, analysis, filled_at) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (partition, model, analysis) DO NOTHING",
        (partition, tenant, prepared.model, prepared.analysis, filled_at),
    )
    return one_row(
        connection,
        "SELECT id FROM ragsidecar_memory_spaces WHERE partition = %s AND tenant = %s AND model = %s AND analysis = %s",
        (partition, tenant, prepared.model, prepared.analysis),
    )[0]


def _advance(
    connection: psycopg.Connection,
    tenant: str,
    partition: _Partition,
    change: int,
    documents: int,
    grown: int,
    only_space: int | None = None,
) -> None:
    """Records the partition's new change, document count and growth in bytes; the spaces that held every
    document before it (all of them, or `only_space`) still do."""
    connection.execute(
        "UPDATE ragsidecar_memory_partitions SET changes = %s, documents = %s, bytes = bytes + %s "
        "WHERE id = %s AND tenant = %s",
        (change, documents, grown, partition.id, tenant),
    )
    connection.execute(
        "UPDATE ragsidecar_memory_spaces SET filled_at = %s WHERE partition = %s AND tenant = %s "
        "AND filled_at = %s AND (%s::bigint IS NULL OR id = %s)",
        (change, partition.id, tenant, partition.changes, only_space, only_space),
    )


def _check_namespace_bytes(connection: psycopg.Connection, namespace: str, limit: int) -> None:
    """Refuses the transaction's write when the namespace's partitions, this write included, pass `limit`. Run
    after the write's rows: it reads every tenant's partitions (across_tenants lasts until the transaction ends).
    Writes committing at the same moment on other replicas each see the total without the others', so the bound
    may be passed by what those writes add (at most max_memory_bytes_per_request each)."""
    across_tenants(connection)
    (total,) = one_row(
        connection,
        "SELECT coalesce(sum(bytes), 0) FROM ragsidecar_memory_partitions WHERE namespace = %s",
        (namespace,),
    )
    if total > limit:
        raise SidecarError(
            ErrorKind.RESOURCE_EXHAUSTED,
            "LIMIT_EXCEEDED",
            "the chat bindings' corpora are full (retrieval.binding_store_bytes, for all replicas "
            "of this database); close or reset bindings, or raise the limit",
        )


def drop_orphaned_corpora(connection: psycopg.Connection) -> int:
    """Drops binding corpora whose binding is gone (a replica that died between deleting a binding's row and
    dropping its corpus leaves one); returns how many. Reads every tenant's rows (across_tenants lasts until the
    transaction ends): call it in a transaction of its own."""
    across_tenants(connection)
    orphans = connection.execute(
        "SELECT p.id, p.tenant FROM ragsidecar_memory_partitions p WHERE p.namespace = 'binding' AND NOT EXISTS "
        "(SELECT 1 FROM ragsidecar_chat_bindings b WHERE b.id = p.source AND b.tenant = p.tenant) "
        "FOR UPDATE OF p SKIP LOCKED"
    ).fetchall()
    for partition, tenant in orphans:
        _remove_partition(connection, tenant, partition)
    return len(orphans)


def _insert_chunks(
    connection: psycopg.Connection,
    key: PartitionKey,
    space: int,
    embedded: list[tuple[Chunk, np.ndarray]],
    change: int,
    fields: dict[str, dict[str, filters.Value]],
) -> None:
    """Chunks (renumbered within their documents) with their keys and vectors, stamped with `change`; each chunk's
    meta carries its document's `fields` (what filters see)."""
    if not embedded:
        return
    use_vectors(connection)
    chunks = _numbered(key.source, [c for c, _ in embedded])
    connection.cursor().executemany(
        "INSERT INTO ragsidecar_memory_chunks (space, tenant, document, key, change, chunk_id, text, meta, embedding) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %b::vector)",
        [
            (
                space,
                key.tenant,
                c.provenance.document_id,
                chunk_key,
                change,
                c.id,
                c.text,
                Jsonb({**chunk_meta(c), "fields": filters.to_json(fields[c.provenance.document_id])}),
                Vector(v),
            )
            for chunk_key, c, (_, v) in zip(chunk_keys(chunks), chunks, embedded, strict=True)
        ],
    )


def _numbered(source: str, chunks: list[Chunk]) -> list[Chunk]:
    """Chunks numbered within their own document, with ids that stay unique in the source: chunking a write's
    documents together numbers them across the write, which says nothing once other writes interleave."""
    positions: dict[str, int] = collections.Counter()
    numbered = []
    for chunk in chunks:
        document = chunk.provenance.document_id
        position = positions[document]
        positions[document] += 1
        numbered.append(
            replace(chunk, position=position, id=f"{source}:{document}:{position}:{chunk.content_hash[:12]}")
        )
    return numbered


def _remove_chunks(
    connection: psycopg.Connection, tenant: str, partition: int, documents: Iterable[str], change: int
) -> dict[int, int]:
    """Deletes the documents' chunks in every space of the partition and logs their keys under `change`; returns
    how many it logged per space."""
    return dict(
        connection.execute(
            "WITH gone AS (DELETE FROM ragsidecar_memory_chunks c USING ragsidecar_memory_spaces s "
            "    WHERE c.space = s.id AND s.partition = %(partition)s AND s.tenant = %(tenant)s "
            "    AND c.tenant = %(tenant)s AND c.document = ANY(%(documents)s) RETURNING c.space, c.key), "
            "logged AS (INSERT INTO ragsidecar_memory_removals (space, tenant, change, key) "
            "    SELECT space, %(tenant)s, %(change)s, key FROM gone RETURNING space) "
            "SELECT space, count(*) FROM logged GROUP BY space",
            {"partition": partition, "tenant": tenant, "documents": list(documents), "change": change},
        ).fetchall()
    )


def _log_removals(connection: psycopg.Connection, tenant: str, logged: dict[int, int], limit: int) -> int:
    """Counts the removals logged per space and prunes each space's log to its newest `limit` entries, whole
    changes at a time (an index older than what is left reloads the space). Returns the removals logged."""
    for space, count in logged.items():
        (entries,) = one_row(
            connection,
            "UPDATE ragsidecar_memory_spaces SET logged = logged + %s WHERE id = %s AND tenant = %s RETURNING logged",
            (count, space, tenant),
        )
        if entries <= limit:
            continue
        (oldest_kept,) = one_row(
            connection,
            "SELECT change FROM ragsidecar_memory_removals WHERE space = %s AND tenant = %s "
            "ORDER BY change DESC OFFSET %s LIMIT 1",
            (space, tenant, limit),
        )
        pruned = connection.execute(
            "DELETE FROM ragsidecar_memory_removals WHERE space = %s AND tenant = %s AND change <= %s",
            (space, tenant, oldest_kept),
        ).rowcount
        connection.execute(
            "UPDATE ragsidecar_memory_spaces SET log_from = %s, logged = logged - %s WHERE id = %s AND tenant = %s",
            (oldest_kept, pruned, space, tenant),
        )
        metrics.STORE_CHANGE_LOG_PRUNED.inc(pruned)
    return sum(logged.values())


def _change_log_size(connection: psycopg.Connection) -> int:
    """Removed chunk keys in the change log, every tenant's (a transaction of its own)."""
    across_tenants(connection)
    return one_row(connection, "SELECT coalesce(sum(logged), 0) FROM ragsidecar_memory_spaces")[0]


# -- deletes --------------------------------------------------------------------------------------------------------


def _delete(
    connection: psycopg.Connection, key: PartitionKey, ids: list[str], change_log_entries: int
) -> tuple[DeleteOutcome, int]:
    if _partition_row(connection, key) is None:
        return DeleteOutcome(0, len(ids), 0), 0
    partition = _lock_partition(connection, key)
    deleted = [
        _document(r)
        for r in connection.execute(
            "DELETE FROM ragsidecar_memory_documents d WHERE d.partition = %s AND d.tenant = %s AND d.id = ANY(%s) "
            f"RETURNING {_DOCUMENT}",
            (partition.id, key.tenant, ids),
        )
    ]
    if not deleted:
        return DeleteOutcome(0, len(ids), partition.documents), 0
    change = partition.changes + 1
    removed = _remove_chunks(connection, key.tenant, partition.id, [d.id for d in deleted], change)
    count = partition.documents - len(deleted)
    _advance(connection, key.tenant, partition, change, count, -sum(d.size() for d in deleted))
    logged = _log_removals(connection, key.tenant, removed, change_log_entries)
    return DeleteOutcome(len(deleted), len(ids) - len(deleted), count), logged


def _purge(
    connection: psycopg.Connection, key: PartitionKey, ids: list[str], now: int, log_entries: int
) -> tuple[DeleteOutcome, int]:
    """Deletes those of `ids` still expired at `now` (a write may have renewed one since they were found)."""
    stored = _stored_in(connection, key, ids)
    return _delete(connection, key, [i for i, d in stored.items() if d.expired(now)], log_entries)


def _stored_in(connection: psycopg.Connection, key: PartitionKey, ids: list[str]) -> dict[str, MemoryDocument]:
    partition = _partition_row(connection, key)
    return {} if partition is None else _stored(connection, key.tenant, partition.id, ids)


def _clear(connection: psycopg.Connection, key: PartitionKey) -> None:
    """Empties the partition. Its spaces' logs start again after this change: an index from before it reloads
    (an empty space), rather than the log holding a key per chunk the partition had."""
    if _partition_row(connection, key) is None:
        return
    partition = _lock_partition(connection, key)
    change = partition.changes + 1
    _remove_all(connection, key.tenant, partition.id)
    connection.execute(
        "UPDATE ragsidecar_memory_spaces SET filled_at = %s, log_from = %s, logged = 0 "
        "WHERE partition = %s AND tenant = %s",
        (change, change, partition.id, key.tenant),
    )
    connection.execute(
        "UPDATE ragsidecar_memory_partitions SET changes = %s, documents = 0, bytes = 0 WHERE id = %s AND tenant = %s",
        (change, partition.id, key.tenant),
    )


def _drop(connection: psycopg.Connection, key: PartitionKey) -> None:
    if _partition_row(connection, key) is None:
        return
    _remove_partition(connection, key.tenant, _lock_partition(connection, key).id)


def _remove_partition(connection: psycopg.Connection, tenant: str, partition: int) -> None:
    _remove_all(connection, tenant, partition)
    connection.execute("DELETE FROM ragsidecar_memory_spaces WHERE partition = %s AND tenant = %s", (partition, tenant))
    connection.execute("DELETE FROM ragsidecar_memory_partitions WHERE id = %s AND tenant = %s", (partition, tenant))


def _remove_all(connection: psycopg.Connection, tenant: str, partition: int) -> None:
    spaces = [
        r[0]
        for r in connection.execute(
            "SELECT id FROM ragsidecar_memory_spaces WHERE partition = %s AND tenant = %s", (partition, tenant)
        )
    ]
    for table in (
        "ragsidecar_memory_removals",
        "ragsidecar_memory_chunks",
        "ragsidecar_memory_snapshots",
        "ragsidecar_memory_snapshot_parts",
    ):
        connection.execute(f"DELETE FROM {table} WHERE space = ANY(%s) AND tenant = %s", (spaces, tenant))
    connection.execute(
        "DELETE FROM ragsidecar_memory_documents WHERE partition = %s AND tenant = %s", (partition, tenant)
    )


# -- reads and fill-ins ---------------------------------------------------------------------------------------------


def _partition_row(connection: psycopg.Connection, key: PartitionKey) -> _Partition | None:
    row = connection.execute(
        "SELECT id, changes, documents FROM ragsidecar_memory_partitions WHERE key = %s AND tenant = %s",
        (key.key, key.tenant),
    ).fetchone()
    return None if row is None else _Partition(*row)


def _last(connection: psycopg.Connection, key: PartitionKey) -> MemoryDocument | None:
    """The partition's latest document (what a new one is written after), None when it holds none."""
    row = connection.execute(
        "SELECT d.id, d.text, d.metadata FROM ragsidecar_memory_documents d JOIN ragsidecar_memory_partitions p "
        "ON p.id = d.partition WHERE p.key = %s AND p.tenant = %s AND d.tenant = %s ORDER BY d.seq DESC LIMIT 1",
        (key.key, key.tenant, key.tenant),
    ).fetchone()
    return None if row is None else MemoryDocument(row[0], row[1], dict(row[2]))


def _documents(connection: psycopg.Connection, key: PartitionKey) -> list[tuple[str, str]]:
    """The partition's documents not expired, in the order first written."""
    return connection.execute(
        "SELECT d.id, d.text FROM ragsidecar_memory_documents d JOIN ragsidecar_memory_partitions p "
        "ON p.id = d.partition WHERE p.key = %s AND p.tenant = %s AND d.tenant = %s "
        "AND (d.expires IS NULL OR d.expires > %s) ORDER BY d.seq",
        (key.key, key.tenant, key.tenant, time.time_ns()),
    ).fetchall()


# A document row's columns, as _document reads them.
_DOCUMENT = "d.id, d.text, d.metadata, d.typed, d.expires, d.created, d.updated"


def _document(row: tuple) -> MemoryDocument:
    i, text, metadata, typed, expires, created, updated = row
    return MemoryDocument(i, text, metadata, filters.from_json(typed), expires, created=created, updated=updated)


def _stored(connection: psycopg.Connection, tenant: str, partition: int, ids: list[str]) -> dict[str, MemoryDocument]:
    rows = connection.execute(
        f"SELECT {_DOCUMENT} FROM ragsidecar_memory_documents d WHERE d.partition = %s AND d.tenant = %s "
        "AND d.id = ANY(%s)",
        (partition, tenant, ids),
    )
    return {d.id: d for d in map(_document, rows)}


def _page(
    connection: psycopg.Connection, key: PartitionKey, keep: filters.Filter, after: str, limit: int, now: int
) -> Page:
    partition = _partition_row(connection, key)
    if partition is None:
        return Page([], None)
    rows = connection.execute(
        f"SELECT {_DOCUMENT} FROM ragsidecar_memory_documents d WHERE d.partition = %s AND d.tenant = %s "
        'AND d.id COLLATE "C" > %s ORDER BY d.id COLLATE "C" LIMIT %s',
        (partition.id, key.tenant, after, LIST_SCAN_BOUND),
    ).fetchall()
    return page_of([_document(row) for row in rows], keep, now, limit)


def _matching(connection: psycopg.Connection, key: PartitionKey, keep: filters.Filter) -> list[str]:
    partition = _partition_row(connection, key)
    if partition is None:
        return []
    rows = connection.execute(
        f"SELECT {_DOCUMENT} FROM ragsidecar_memory_documents d WHERE d.partition = %s AND d.tenant = %s",
        (partition.id, key.tenant),
    )
    return [d.id for d in map(_document, rows) if filters.matches(keep, d.fields())]


def _expired(connection: psycopg.Connection, namespace: str, now: int) -> dict[PartitionKey, list[str]]:
    """Up to PURGE_BOUND documents of the namespace expired at `now`, every tenant's, by partition."""
    across_tenants(connection)
    found: dict[PartitionKey, list[str]] = {}
    for tenant, session, source, document in connection.execute(
        "SELECT p.tenant, p.session, p.source, d.id FROM ragsidecar_memory_documents d "
        "JOIN ragsidecar_memory_partitions p ON p.id = d.partition AND p.tenant = d.tenant "
        "WHERE d.expires <= %s AND p.namespace = %s LIMIT %s",
        (now, namespace, PURGE_BOUND),
    ):
        found.setdefault(PartitionKey(namespace, tenant, session, source), []).append(document)
    return found


@dataclass(frozen=True)
class _SpaceState:
    partition: int | None  # None: the partition was never written
    changes: int
    documents: int
    space: int | None  # None: no chunks of this model and analysis yet
    filled_at: int
    log_from: int

    @property
    def complete(self) -> bool:
        """Whether the space holds chunks of every document."""
        return self.documents == 0 or self.filled_at == self.changes


def _space_state(connection: psycopg.Connection, key: PartitionKey, model: str, analysis: str) -> _SpaceState:
    """The one query a search asks before answering from a resident index."""
    row = connection.execute(
        "SELECT p.id, p.changes, p.documents, s.id, s.filled_at, s.log_from FROM ragsidecar_memory_partitions p "
        "LEFT JOIN ragsidecar_memory_spaces s ON s.partition = p.id AND s.tenant = p.tenant AND s.model = %s "
        "AND s.analysis = %s WHERE p.key = %s AND p.tenant = %s",
        (model, analysis, key.key, key.tenant),
    ).fetchone()
    if row is None:
        return _SpaceState(None, 0, 0, None, 0, 0)
    partition, changes, documents, space, filled_at, log_from = row
    return _SpaceState(partition, changes, documents, space, -1 if filled_at is None else filled_at, log_from or 0)


def _missing_documents(
    connection: psycopg.Connection, tenant: str, partition: int | None, space: int | None
) -> list[tuple[str, str]]:
    """Documents with no chunk in the space, in partition order."""
    return connection.execute(
        "SELECT d.id, d.text FROM ragsidecar_memory_documents d WHERE d.partition = %s AND d.tenant = %s "
        "AND NOT EXISTS (SELECT 1 FROM ragsidecar_memory_chunks c WHERE c.space = %s AND c.tenant = %s "
        "AND c.document = d.id) ORDER BY d.seq",
        (partition, tenant, space, tenant),
    ).fetchall()


def _fill(
    connection: psycopg.Connection, key: PartitionKey, embedded: list[tuple[str, str]], prepared: Prepared
) -> None:
    """Adds the embedded documents' chunks to the space where they are still missing and unchanged, as a change of
    the partition; marks the space filled when that covers every document still missing (one that yields no
    chunk counts as covered)."""
    partition = _lock_partition(connection, key)
    space = _own_space(connection, key.tenant, partition.id, prepared, filled_at=-1)
    texts = dict(embedded)
    missing = _missing_documents(connection, key.tenant, partition.id, space)
    covered = {i for i, text in missing if texts.get(i) == text}
    change = partition.changes + 1
    stored = _stored(connection, key.tenant, partition.id, list(covered))
    _insert_chunks(
        connection,
        key,
        space,
        [(c, v) for c, v in zip(prepared.chunks, prepared.vectors, strict=True) if c.provenance.document_id in covered],
        change,
        {i: d.fields() for i, d in stored.items()},
    )
    _advance(connection, key.tenant, partition, change, partition.documents, 0)
    if len(covered) == len(missing):
        connection.execute(
            "UPDATE ragsidecar_memory_spaces SET filled_at = %s WHERE id = %s AND tenant = %s",
            (change, space, key.tenant),
        )


# -- catching up ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Changes:
    """A space's changes after a position, or all of its chunks: read from one snapshot."""

    position: int  # the partition's latest change in that snapshot
    documents: int
    removed: list[str]
    added: tuple[list[str], list[IndexedChunk], np.ndarray]


_NO_VECTORS = np.zeros((0, 1), np.float32)
# The space's partition, in the statement's snapshot (no row: the partition was dropped meanwhile).
_STATE = """
WITH state AS (
    SELECT p.changes, p.documents, s.log_from FROM ragsidecar_memory_spaces s
    JOIN ragsidecar_memory_partitions p ON p.id = s.partition AND p.tenant = s.tenant
    WHERE s.id = %(space)s AND s.tenant = %(tenant)s)
"""
# Chunks removed (chunk_id NULL) and added after a position, from one snapshot; no change when the space's log no
# longer reaches back to the position.
_CHANGES_SINCE = (
    _STATE
    + """
SELECT state.changes, state.documents, state.log_from, changed.* FROM state LEFT JOIN (
    SELECT r.key, NULL::text AS chunk_id, NULL::text AS text, NULL::jsonb AS meta, NULL::bytea AS vector
    FROM ragsidecar_memory_removals r WHERE r.space = %(space)s AND r.tenant = %(tenant)s AND r.change > %(since)s
    UNION ALL
    SELECT c.key, c.chunk_id, c.text, c.meta, vector_send(c.embedding)
    FROM ragsidecar_memory_chunks c WHERE c.space = %(space)s AND c.tenant = %(tenant)s AND c.change > %(since)s
) changed ON state.log_from <= %(since)s
"""
)
_SPACE_CHUNKS = (
    _STATE
    + """
SELECT state.changes, state.documents, c.key, c.chunk_id, c.text, c.meta, vector_send(c.embedding)
FROM state LEFT JOIN ragsidecar_memory_chunks c ON c.space = %(space)s AND c.tenant = %(tenant)s
"""
)


def _changes_since(connection: psycopg.Connection, tenant: str, space: int, since: int) -> _Changes | None:
    """The space's changes after position `since`; None when its log no longer reaches back that far (or the
    partition is gone)."""
    rows = (
        connection.cursor(binary=True)
        .execute(_CHANGES_SINCE, {"space": space, "tenant": tenant, "since": since})
        .fetchall()
    )
    if not rows or rows[0][2] > since:
        return None
    changed = [row[3:] for row in rows if row[3] is not None]
    removed = [chunk_key for chunk_key, chunk_id, *_ in changed if chunk_id is None]
    added = [row for row in changed if row[1] is not None]
    return _Changes(rows[0][0], rows[0][1], removed, _chunks(added))


def _space_chunks(connection: psycopg.Connection, tenant: str, space: int) -> _Changes:
    """Every chunk of the space (none when the partition is gone)."""
    rows = connection.cursor(binary=True).execute(_SPACE_CHUNKS, {"space": space, "tenant": tenant}).fetchall()
    if not rows:
        return _Changes(0, 0, [], _chunks([]))
    return _Changes(rows[0][0], rows[0][1], [], _chunks([row[2:] for row in rows if row[2] is not None]))


def _chunks(rows: list[tuple]) -> tuple[list[str], list[IndexedChunk], np.ndarray]:
    """(key, chunk id, text, meta, vector_send bytes) rows as keys, chunks and float32 vectors."""
    if not rows:
        return [], [], _NO_VECTORS
    keys = [row[0] for row in rows]
    chunks = [IndexedChunk(chunk_id, text, meta) for _, chunk_id, text, meta, _ in rows]
    # pgvector's binary form: dimensions (uint16) and an unused uint16, then big-endian float32s; the 4-byte head
    # reads as one more column, dropped.
    packed = np.frombuffer(b"".join(row[4] for row in rows), dtype=">f4").reshape(len(rows), -1)
    return keys, chunks, packed[:, 1:].astype(np.float32)


def _apply(resident: Resident, changes: _Changes) -> bool:
    """Applies the changes to the resident index; False, and nothing applied, when its vectors do not fit the
    index (one built empty, of no dimensions yet). A replaced chunk is added again under its key, which replaces
    it in one step (removing it first would let a search running meanwhile miss its document)."""
    keys, chunks, vectors = changes.added
    if keys and vectors.shape[1] != resident.index.dimensions:
        return False
    vectors = vectors.reshape(len(keys), resident.index.dimensions)
    readded = set(keys)
    removed = [k for k in changes.removed if k not in readded]
    resident.index.update(removed, chunks, vectors, keys, position=changes.position)
    resident.position, resident.documents = changes.position, changes.documents
    return True


# -- vectors on the wire ----------------------------------------------------------------------------------------


class Vector:
    """A float vector sent in pgvector's binary form (`%b::vector`), without formatting floats as text."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Vector) -> bytes:
        values = np.asarray(obj.values, dtype=">f4").reshape(-1)
        return struct.pack(">HH", values.shape[0], 0) + values.tobytes()


def use_vectors(connection: psycopg.Connection) -> None:
    """Lets `Vector` parameters through on this connection (a pool's connections predate this module)."""
    connection.adapters.register_dumper(Vector, _VectorDumper)
