"""MEMORY documents and chat bindings' corpora in PostgreSQL, shared by every replica (`[store] backend = "postgres"`).

The same public methods as the embedded `knowledge.memory.MemoryStore`, over the tables of
migrations/0002_memory.sql. A partition is one (namespace, tenant, session, source), found by
`key_of(namespace, tenant, session, source)`: "memory" partitions hold UpsertDocuments' documents, "binding"
ones chat bindings' corpora, so no choice of ids makes two share rows. Every statement also filters on the
tenant, and runs with it set for the row-level security policies.

Writes: documents are chunked and embedded BEFORE the transaction (off the event loop, by the catalog, whose
embedding cache makes unchanged texts free); then one transaction locks the partition's row (writes of one
partition are serialised, on every replica), writes documents, chunks with their vectors and BM25 postings,
and draws a new partition version. The call returns only after the commit, so an acknowledged write is
durable and every replica's next read sees it; a replica killed mid-write leaves a transaction that
PostgreSQL rolls back, with nothing half-written and no temp file to sweep.

Chunks live in a "space" per (model fingerprint, lexical analysis): a write fills the space of the current
embedder and drops the changed documents' chunks from every other space, which is filled in when a replica
with that model next loads the partition (`index`). Nothing is held in process memory: every read goes to
the database.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from ragsidecar import metrics
from ragsidecar.errors import ErrorKind, SidecarError
from ragsidecar.identifiers import key_of
from ragsidecar.knowledge import lexical
from ragsidecar.knowledge.catalog import chunk_meta
from ragsidecar.knowledge.chunking import Chunk
from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.memory import DeleteOutcome, MemoryDocument, UpsertOutcome, check_request_size
from ragsidecar.knowledge.sources import Provenance, Unit
from ragsidecar.store.cursors import across_tenants
from ragsidecar.store.search import PostgresIndex, Vector, ensure_dense_index, use_vectors

if TYPE_CHECKING:
    from ragsidecar.store.database import Database

# Fill-ins of a space raced by writes of other replicas before a load gives up and serves what is there.
_FILL_ATTEMPTS = 3
# Postings per INSERT statement (bounds one statement's parameters).
_POSTINGS_BATCH = 50_000


@dataclass(frozen=True)
class PartitionKey:
    namespace: str  # "memory" or "binding"
    tenant: str
    session: str
    source: str

    @property
    def key(self) -> str:
        return key_of(self.namespace, self.tenant, self.session, self.source)


@dataclass(frozen=True)
class Prepared:
    """Documents' chunks with their vectors, as one embedder and one lexical analysis made them: what a write
    stores in the space of (`model`, `analysis`). A chunk's `provenance.document_id` names its document."""

    model: str
    analysis: str  # a lexical.LANGUAGES name
    chunks: list[Chunk]
    vectors: np.ndarray  # float32 [len(chunks), dimensions]


# The catalog's chunk-and-embed: (scope, source name, units) -> Prepared.
Prepare = Callable[[Scope, str, list[Unit]], Awaitable[Prepared]]


class DocumentCount(Sequence[Unit]):
    """A partition's units as a loaded source keeps them: their number only (a source's callers count its
    units; `units` reads them), so that loading a large partition does not copy its documents here."""

    def __init__(self, count: int) -> None:
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        raise TypeError("a loaded PostgreSQL partition holds no units: read them with Catalog.units")


class PostgresMemoryStore:
    def __init__(self, database: Database, *, namespace: str, max_request_bytes: int, prepare: Prepare,
                 max_namespace_bytes: int | None = None) -> None:
        """`max_namespace_bytes` bounds the bytes of all the namespace's partitions together, in the whole database
        (the binding corpora: retrieval.binding_store_bytes); None leaves it unbounded (MEMORY lives on disk)."""
        self._database = database
        self._namespace = namespace
        self._max_request_bytes = max_request_bytes
        self._max_namespace_bytes = max_namespace_bytes
        self._prepare = prepare
        # Dimensions whose dense index is known to exist: one per embedder dimension ever configured (a handful).
        self._indexed: set[int] = set()

    def partition(self, scope: Scope, name: str) -> PartitionKey:
        return PartitionKey(self._namespace, scope.tenant, scope.session, name)

    async def units(self, scope: Scope, name: str) -> list[Unit]:
        key = self.partition(scope, name)
        rows = await self._database.run(lambda c: _documents(c, key), tenant=key.tenant)
        return [_unit(document_id, text) for document_id, text in rows]

    def count(self, scope: Scope, name: str) -> int:
        """Documents in the partition (reads the database: call it off the event loop)."""
        key = self.partition(scope, name)
        row = self._database.run_sync(lambda c: _partition_row(c, key), tenant=key.tenant)
        return 0 if row is None else row[2]

    def version(self, scope: Scope, name: str) -> str:
        """Changes whenever the partition's documents change (keys its loaded index). Reads the database: call
        it off the event loop."""
        key = self.partition(scope, name)
        row = self._database.run_sync(lambda c: _partition_row(c, key), tenant=key.tenant)
        return "" if row is None else row[1]

    async def upsert(self, scope: Scope, name: str, documents: list[MemoryDocument]) -> UpsertOutcome:
        check_request_size(documents, self._max_request_bytes)
        prepared = await self._prepare(scope, name, [_unit(d.id, d.text) for d in documents])
        key = self.partition(scope, name)
        await self._ensure_dense_index(prepared)
        return await self._database.run(lambda c: write(c, key, documents, prepared, self._max_namespace_bytes),
                                        tenant=key.tenant)

    async def delete(self, scope: Scope, name: str, ids: list[str]) -> DeleteOutcome:
        key = self.partition(scope, name)
        return await self._database.run(lambda c: _delete(c, key, list(dict.fromkeys(ids))), tenant=key.tenant)

    async def clear(self, scope: Scope, name: str) -> None:
        """Empties the partition (a new version, so its loaded indexes are replaced)."""
        key = self.partition(scope, name)
        await self._database.run(lambda c: _clear(c, key), tenant=key.tenant)

    async def drop(self, scope: Scope, name: str) -> None:
        """Forgets the partition entirely (a closed chat binding)."""
        key = self.partition(scope, name)
        await self._database.run(lambda c: _drop(c, key), tenant=key.tenant)

    def sweep(self) -> tuple[int, int]:
        """Nothing to sweep: a write killed mid-way is a transaction PostgreSQL rolled back."""
        return 0, 0

    async def index(self, scope: Scope, name: str, model: str, analysis: str) -> tuple[PostgresIndex, int]:
        """The partition's searchable space for this model and analysis, and its document count. A space behind
        its partition (written by a replica with another model, or never filled) first gets the missing
        documents' chunks, embedded by the catalog like a write's."""
        key = self.partition(scope, name)
        for attempt in range(_FILL_ATTEMPTS + 1):
            state = await self._database.run(lambda c: _space_state(c, key, model, analysis), tenant=key.tenant)
            if state.complete or attempt == _FILL_ATTEMPTS:
                break
            missing = await self._database.run(lambda c: _missing_documents(c, state), tenant=key.tenant)
            prepared = await self._prepare(scope, name, [_unit(i, text) for i, text in missing])
            if (prepared.model, prepared.analysis) != (model, analysis):
                break  # the embedder changed meanwhile: the caller loads again with the new one
            metrics.STORE_FILLED_CHUNKS.inc(len(prepared.chunks))
            await self._ensure_dense_index(prepared)
            await self._database.run(lambda c: _fill(c, key, state, missing, prepared), tenant=key.tenant)
        return PostgresIndex(self._database, key.tenant, state.space, state.chunks, analysis), state.documents

    async def _ensure_dense_index(self, prepared: Prepared) -> None:
        dimensions = int(prepared.vectors.shape[1])
        if dimensions not in self._indexed:
            await self._database.run(lambda c: ensure_dense_index(c, dimensions))
            self._indexed.add(dimensions)


def _unit(document_id: str, text: str) -> Unit:
    return Unit(text, Provenance(document_id=document_id, char_end=len(text)))


# -- the write transaction (also the bulk-load path: bench/store.py calls `write` with its own vectors) -----------

def write(connection: psycopg.Connection, key: PartitionKey, documents: list[MemoryDocument],
          prepared: Prepared, max_namespace_bytes: int | None = None) -> UpsertOutcome:
    """Upserts `documents` (their chunks and vectors in `prepared`) into the partition, inside the caller's
    transaction; unchanged documents (same text and metadata) are left as they are. The dense index of the
    vectors' dimension must exist (`ensure_dense_index`); run this with the tenant set (`Database.run`).
    A write that would take the namespace's partitions past `max_namespace_bytes` raises RESOURCE_EXHAUSTED
    (the transaction rolls back: nothing of it stays)."""
    partition, version, count = _lock_partition(connection, key)
    stored = {i: (text, metadata) for i, text, metadata in connection.execute(
        "SELECT id, text, metadata FROM ragsidecar_memory_documents WHERE partition = %s AND tenant = %s "
        "AND id = ANY(%s)", (partition, key.tenant, [d.id for d in documents]))}
    changed = [d for d in documents if d.id not in stored or stored[d.id] != (d.text, d.metadata)]
    replaced = sum(d.id in stored for d in changed)
    if not changed:
        return UpsertOutcome(0, 0, len(documents), count)
    connection.cursor().executemany(
        "INSERT INTO ragsidecar_memory_documents (partition, id, tenant, text, metadata) VALUES (%s, %s, %s, %s, %s) "
        "ON CONFLICT (partition, id) DO UPDATE SET text = EXCLUDED.text, metadata = EXCLUDED.metadata",
        [(partition, d.id, key.tenant, d.text, Jsonb(d.metadata)) for d in changed])
    _remove_chunks(connection, key.tenant, partition, [d.id for d in changed])
    # A space new to a partition that already has documents lacks theirs: it is complete only once filled in.
    space, complete_at = _own_space(connection, key.tenant, partition, prepared, version if count == 0 else "")
    ids = {d.id for d in changed}
    _insert_chunks(connection, key, space, [(c, v) for c, v in zip(prepared.chunks, prepared.vectors)
                                            if c.provenance.document_id in ids], prepared.analysis)
    count += len(changed) - replaced
    grown = sum(d.size() for d in changed) - sum(MemoryDocument(d.id, *stored[d.id]).size()
                                                 for d in changed if d.id in stored)
    new_version = _bump(connection, partition, key.tenant, count, grown)
    if complete_at == version:
        _mark_complete(connection, space, key.tenant, new_version)
    if max_namespace_bytes is not None and grown > 0:
        _check_namespace_bytes(connection, key.namespace, max_namespace_bytes)
    return UpsertOutcome(len(changed) - replaced, replaced, len(documents) - len(changed), count)


def _check_namespace_bytes(connection: psycopg.Connection, namespace: str, limit: int) -> None:
    """Refuses the transaction's write when the namespace's partitions, this write included, pass `limit`. Run
    last: it reads every tenant's partitions (across_tenants lasts until the transaction ends). Writes committing
    at the same moment on other replicas each see the total without the others', so the bound may be passed by
    what those writes add (at most max_memory_bytes_per_request each)."""
    across_tenants(connection)
    total = connection.execute("SELECT coalesce(sum(bytes), 0) FROM ragsidecar_memory_partitions "
                               "WHERE namespace = %s", (namespace,)).fetchone()[0]
    if total > limit:
        raise SidecarError(ErrorKind.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED",
                           "the chat bindings' corpora are full (retrieval.binding_store_bytes, for all replicas "
                           "of this database); close or reset bindings, or raise the limit")


def drop_orphaned_corpora(connection: psycopg.Connection) -> int:
    """Drops binding corpora whose binding is gone (a replica that died between deleting a binding's row and
    dropping its corpus leaves one); returns how many. Reads every tenant's rows: call it in a transaction of
    its own, after across_tenants."""
    orphans = connection.execute(
        "SELECT p.id, p.tenant FROM ragsidecar_memory_partitions p WHERE p.namespace = 'binding' AND NOT EXISTS "
        "(SELECT 1 FROM ragsidecar_chat_bindings b WHERE b.id = p.source AND b.tenant = p.tenant) "
        "FOR UPDATE OF p SKIP LOCKED").fetchall()
    for partition, tenant in orphans:
        _remove_partition(connection, tenant, partition)
    return len(orphans)


def _lock_partition(connection: psycopg.Connection, key: PartitionKey) -> tuple[int, str, int]:
    """The partition's (id, version, documents), created when new, its row locked until the transaction ends."""
    return connection.execute(
        "INSERT INTO ragsidecar_memory_partitions (key, tenant, namespace, session, source, version) "
        "VALUES (%s, %s, %s, %s, %s, '') ON CONFLICT (key) "
        "DO UPDATE SET version = ragsidecar_memory_partitions.version RETURNING id, version, documents",
        (key.key, key.tenant, key.namespace, key.session, key.source)).fetchone()


def _own_space(connection: psycopg.Connection, tenant: str, partition: int, prepared: Prepared,
               complete_at: str) -> tuple[int, str]:
    """The space the chunks go to and the partition version at which it held every document; created (with
    `complete_at`) when new."""
    connection.execute(
        "INSERT INTO ragsidecar_memory_spaces (partition, tenant, model, analysis, complete_at) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (partition, model, analysis) DO NOTHING",
        (partition, tenant, prepared.model, prepared.analysis, complete_at))
    return connection.execute(
        "SELECT id, complete_at FROM ragsidecar_memory_spaces WHERE partition = %s AND tenant = %s AND model = %s "
        "AND analysis = %s", (partition, tenant, prepared.model, prepared.analysis)).fetchone()


def _bump(connection: psycopg.Connection, partition: int, tenant: str, documents: int, grown: int) -> str:
    """Draws the partition's new version and records its document count and its growth in bytes."""
    version = uuid.uuid4().hex
    connection.execute("UPDATE ragsidecar_memory_partitions SET version = %s, documents = %s, bytes = bytes + %s "
                       "WHERE id = %s AND tenant = %s", (version, documents, grown, partition, tenant))
    return version


def _mark_complete(connection: psycopg.Connection, space: int, tenant: str, version: str) -> None:
    connection.execute("UPDATE ragsidecar_memory_spaces SET complete_at = %s WHERE id = %s AND tenant = %s",
                       (version, space, tenant))


def _insert_chunks(connection: psycopg.Connection, key: PartitionKey, space: int,
                   embedded: list[tuple[Chunk, np.ndarray]], analysis: str) -> None:
    """Chunks (renumbered within their documents), vectors and postings; the space's BM25 statistics."""
    if not embedded:
        return
    use_vectors(connection)
    chunks = _numbered(key.source, [c for c, _ in embedded])
    analysed = lexical.terms([c.text for c in chunks], analysis)
    row_ids = [r[0] for r in connection.execute(
        "SELECT nextval(pg_get_serial_sequence('ragsidecar_memory_chunks', 'id')) FROM generate_series(1, %s)",
        (len(chunks),))]
    connection.cursor().executemany(
        "INSERT INTO ragsidecar_memory_chunks (id, space, tenant, document, chunk_id, text, meta, terms, embedding) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %b::vector)",
        [(row, space, key.tenant, c.provenance.document_id, c.id, c.text, Jsonb(chunk_meta(c)), len(t), Vector(v))
         for row, c, t, (_, v) in zip(row_ids, chunks, analysed, embedded)])
    # INSERT ... SELECT FROM unnest(arrays), not COPY: COPY FROM refuses tables with row-level security.
    postings = [(term, row, tf, len(t))
                for row, t in zip(row_ids, analysed) for term, tf in collections.Counter(t).items()]
    for start in range(0, len(postings), _POSTINGS_BATCH):
        terms, chunk_rows, frequencies, lengths = zip(*postings[start : start + _POSTINGS_BATCH])
        connection.execute(
            "INSERT INTO ragsidecar_memory_postings (space, term, chunk, tenant, tf, terms) "
            "SELECT %s, term, chunk, %s, tf, terms FROM unnest(%s::text[], %s::bigint[], %s::int[], %s::int[]) "
            "AS p(term, chunk, tf, terms)", (space, key.tenant, list(terms), list(chunk_rows), list(frequencies),
                                             list(lengths)))
    connection.execute("UPDATE ragsidecar_memory_spaces SET chunks = chunks + %s, terms = terms + %s "
                       "WHERE id = %s AND tenant = %s", (len(chunks), sum(map(len, analysed)), space, key.tenant))


def _numbered(source: str, chunks: list[Chunk]) -> list[Chunk]:
    """Chunks numbered within their own document, with ids that stay unique in the source: chunking a write's
    documents together numbers them across the write, which says nothing once other writes interleave."""
    positions: dict[str, int] = collections.Counter()
    numbered = []
    for chunk in chunks:
        document = chunk.provenance.document_id
        position = positions[document]
        positions[document] += 1
        numbered.append(replace(chunk, position=position,
                                id=f"{source}:{document}:{position}:{chunk.content_hash[:12]}"))
    return numbered


def _remove_chunks(connection: psycopg.Connection, tenant: str, partition: int, documents: Iterable[str]) -> None:
    """The documents' chunks and postings in every space of the partition, with the spaces' statistics."""
    removed = connection.execute(
        "DELETE FROM ragsidecar_memory_chunks c USING ragsidecar_memory_spaces s WHERE c.space = s.id "
        "AND s.partition = %s AND s.tenant = %s AND c.tenant = %s AND c.document = ANY(%s) "
        "RETURNING c.space, c.id, c.terms", (partition, tenant, tenant, list(documents))).fetchall()
    if not removed:
        return
    connection.execute("DELETE FROM ragsidecar_memory_postings WHERE tenant = %s AND chunk = ANY(%s)",
                       (tenant, [row for _, row, _ in removed]))
    per_space: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    for space, _, terms in removed:
        per_space[space][0] += 1
        per_space[space][1] += terms
    connection.cursor().executemany(
        "UPDATE ragsidecar_memory_spaces SET chunks = chunks - %s, terms = terms - %s WHERE id = %s AND tenant = %s",
        [(chunks, terms, space, tenant) for space, (chunks, terms) in per_space.items()])


# -- deletes --------------------------------------------------------------------------------------------------------

def _delete(connection: psycopg.Connection, key: PartitionKey, ids: list[str]) -> DeleteOutcome:
    row = _partition_row(connection, key)
    if row is None:
        return DeleteOutcome(0, len(ids), 0)
    partition, version, count = _lock_partition(connection, key)
    deleted = [MemoryDocument(*r) for r in connection.execute(
        "DELETE FROM ragsidecar_memory_documents WHERE partition = %s AND tenant = %s AND id = ANY(%s) "
        "RETURNING id, text, metadata", (partition, key.tenant, ids))]
    if deleted:
        _remove_chunks(connection, key.tenant, partition, [d.id for d in deleted])
        count -= len(deleted)
        freed = sum(d.size() for d in deleted)
        _advance(connection, key.tenant, partition, version, _bump(connection, partition, key.tenant, count, -freed))
    return DeleteOutcome(len(deleted), len(ids) - len(deleted), count)


def _advance(connection: psycopg.Connection, tenant: str, partition: int, old: str, new: str) -> None:
    """Spaces that held every document before a deletion still do after it."""
    connection.execute("UPDATE ragsidecar_memory_spaces SET complete_at = %s WHERE partition = %s AND tenant = %s "
                       "AND complete_at = %s", (new, partition, tenant, old))


def _clear(connection: psycopg.Connection, key: PartitionKey) -> None:
    partition, version, _ = _lock_partition(connection, key)
    _remove_all(connection, key.tenant, partition)
    connection.execute("UPDATE ragsidecar_memory_spaces SET chunks = 0, terms = 0 WHERE partition = %s "
                       "AND tenant = %s", (partition, key.tenant))
    connection.execute("UPDATE ragsidecar_memory_partitions SET bytes = 0 WHERE id = %s AND tenant = %s",
                       (partition, key.tenant))
    _advance(connection, key.tenant, partition, version, _bump(connection, partition, key.tenant, 0, 0))


def _drop(connection: psycopg.Connection, key: PartitionKey) -> None:
    row = _partition_row(connection, key)
    if row is None:
        return
    _remove_partition(connection, key.tenant, _lock_partition(connection, key)[0])


def _remove_partition(connection: psycopg.Connection, tenant: str, partition: int) -> None:
    _remove_all(connection, tenant, partition)
    connection.execute("DELETE FROM ragsidecar_memory_spaces WHERE partition = %s AND tenant = %s", (partition, tenant))
    connection.execute("DELETE FROM ragsidecar_memory_partitions WHERE id = %s AND tenant = %s", (partition, tenant))


def _remove_all(connection: psycopg.Connection, tenant: str, partition: int) -> None:
    spaces = [r[0] for r in connection.execute(
        "SELECT id FROM ragsidecar_memory_spaces WHERE partition = %s AND tenant = %s", (partition, tenant))]
    connection.execute("DELETE FROM ragsidecar_memory_postings WHERE space = ANY(%s) AND tenant = %s", (spaces, tenant))
    connection.execute("DELETE FROM ragsidecar_memory_chunks WHERE space = ANY(%s) AND tenant = %s", (spaces, tenant))
    connection.execute("DELETE FROM ragsidecar_memory_documents WHERE partition = %s AND tenant = %s",
                       (partition, tenant))


# -- reads and fill-ins ---------------------------------------------------------------------------------------------

def _partition_row(connection: psycopg.Connection, key: PartitionKey) -> tuple[int, str, int] | None:
    return connection.execute("SELECT id, version, documents FROM ragsidecar_memory_partitions WHERE key = %s "
                              "AND tenant = %s", (key.key, key.tenant)).fetchone()


def _documents(connection: psycopg.Connection, key: PartitionKey) -> list[tuple[str, str]]:
    return connection.execute(
        "SELECT d.id, d.text FROM ragsidecar_memory_documents d JOIN ragsidecar_memory_partitions p "
        "ON p.id = d.partition WHERE p.key = %s AND p.tenant = %s AND d.tenant = %s ORDER BY d.seq",
        (key.key, key.tenant, key.tenant)).fetchall()


@dataclass(frozen=True)
class _SpaceState:
    tenant: str
    partition: int | None  # None: the partition was never written
    version: str
    documents: int
    space: int | None  # None: no chunks of this model and analysis yet
    chunks: int
    complete: bool


def _space_state(connection: psycopg.Connection, key: PartitionKey, model: str, analysis: str) -> _SpaceState:
    row = connection.execute(
        "SELECT p.id, p.version, p.documents, s.id, s.chunks, s.complete_at FROM ragsidecar_memory_partitions p "
        "LEFT JOIN ragsidecar_memory_spaces s ON s.partition = p.id AND s.tenant = p.tenant AND s.model = %s "
        "AND s.analysis = %s WHERE p.key = %s AND p.tenant = %s", (model, analysis, key.key, key.tenant)).fetchone()
    if row is None:
        return _SpaceState(key.tenant, None, "", 0, None, 0, True)
    partition, version, documents, space, chunks, complete_at = row
    return _SpaceState(key.tenant, partition, version, documents, space, chunks or 0,
                       complete_at == version or documents == 0)


def _missing_documents(connection: psycopg.Connection, state: _SpaceState) -> list[tuple[str, str]]:
    """Documents with no chunk in the space, in partition order."""
    return connection.execute(
        "SELECT d.id, d.text FROM ragsidecar_memory_documents d WHERE d.partition = %s AND d.tenant = %s "
        "AND NOT EXISTS (SELECT 1 FROM ragsidecar_memory_chunks c WHERE c.space = %s AND c.tenant = %s "
        "AND c.document = d.id) ORDER BY d.seq", (state.partition, state.tenant, state.space, state.tenant)).fetchall()


def _fill(connection: psycopg.Connection, key: PartitionKey, state: _SpaceState, embedded: list[tuple[str, str]],
          prepared: Prepared) -> None:
    """Adds the embedded documents' chunks to the space where they are still missing and unchanged; marks the
    space complete when that covers every document still missing (one that yields no chunk counts as covered)."""
    partition, version, _ = _lock_partition(connection, key)
    space, _ = _own_space(connection, key.tenant, partition, prepared, "")
    texts = dict(embedded)
    missing = _missing_documents(connection, replace(state, space=space))
    covered = {i for i, text in missing if texts.get(i) == text}
    _insert_chunks(connection, key, space, [(c, v) for c, v in zip(prepared.chunks, prepared.vectors)
                                            if c.provenance.document_id in covered], prepared.analysis)
    if len(covered) == len(missing):
        _mark_complete(connection, space, key.tenant, version)
