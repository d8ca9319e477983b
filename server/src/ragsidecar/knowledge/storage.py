"""The storage ports: what the domain needs of storage, and the records it exchanges with it. They live in the
domain they serve; the backends under `ragsidecar.store` implement them and import them from here.

Two backends implement all of it: `embedded` (store/embedded.py: SQLite in WAL mode and in-process
incremental indexes, this process only) and `postgres` (store/postgres.py: PostgreSQL is the source of truth,
shared by every replica, each replica searching a local incremental index caught up from the database's change
log). store/factory.py picks one at start-up; no other module asks which one runs.

- `DocumentStore`: documents the host writes by id, partitioned by (tenant, session, source): MEMORY
  knowledge, and the live corpora of chat bindings. A write costs what it changes, and the next search,
  on any replica, sees it.
- `BindingRegistry`: the open chat bindings.
- `CursorPositions`: SEQUENTIAL cursors.
- `VectorCache`: vectors other replicas already embedded.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from ragsidecar.errors import Violation, invalid
from ragsidecar.knowledge import conversation, filters
from ragsidecar.knowledge.declarations import Entry, Scope, SourceType, Use
from ragsidecar.knowledge.sources.units import Provenance, Unit

if TYPE_CHECKING:
    from ragsidecar.knowledge.chunking import Chunk
    from ragsidecar.knowledge.index import HybridIndex

# Document stores: MEMORY partitions, and the chat bindings' corpora.
Namespace = Literal["memory", "binding"]


@dataclass(frozen=True)
class MemoryDocument:
    id: str
    text: str
    metadata: dict[str, str]
    # Typed metadata (filters.Value by key; no key of `metadata`, none starting with "$").
    typed: dict[str, filters.Value] = field(default_factory=dict)
    # When it expires, in nanoseconds since the epoch; None: never.
    expires_at: int | None = None
    # When its id was first written and when it last changed (nanoseconds; the store sets them, 0 before).
    created: int = field(default=0, compare=False)
    updated: int = field(default=0, compare=False)

    def size(self) -> int:
        """UTF-8 bytes of the id, text and metadata (typed values as JSON): what the per-call limit counts."""
        typed = json.dumps(filters.to_json(self.typed), ensure_ascii=False) if self.typed else ""
        return sum(
            len(s.encode("utf-8", "surrogatepass"))
            for s in (self.id, self.text, *self.metadata.keys(), *self.metadata.values(), typed)
        )

    def fields(self) -> dict[str, filters.Value]:
        """What a filter sees of the document: its metadata (string entries under "$" keys are not filterable),
        its typed metadata, "$id" and its timestamps."""
        fields: dict[str, filters.Value] = {k: v for k, v in self.metadata.items() if not k.startswith("$")}
        fields.update(self.typed)
        fields[filters.ID] = self.id
        fields[filters.CREATED] = filters.Instant(self.created)
        fields[filters.UPDATED] = filters.Instant(self.updated)
        if self.expires_at is not None:
            fields[filters.EXPIRES_AT] = filters.Instant(self.expires_at)
        return fields

    def expired(self, now: int) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def unit(self) -> Unit:
        return document_unit(self.id, self.text)


def units_of(documents: list[MemoryDocument], last: MemoryDocument | None) -> list[Unit]:
    """What a write chunks and indexes of its documents, written in this order after `last` (the partition's
    latest document; None: none, or not before them): a conversation turn with the turn before it
    (knowledge/conversation.py), every other document its text."""
    return conversation.units_of(documents, last)


def document_unit(document_id: str, text: str) -> Unit:
    """A stored document as a knowledge unit (what chunking, DIRECT and SEQUENTIAL read)."""
    return Unit(text, Provenance(document_id=document_id, char_end=len(text)))


@dataclass(frozen=True)
class UpsertOutcome:
    inserted: int
    replaced: int
    unchanged: int
    count: int


@dataclass(frozen=True)
class DeleteOutcome:
    deleted: int
    not_found: int
    count: int


@dataclass(frozen=True)
class Page:
    """A page of a listing: the documents a filter kept, and the id to list after for the next page (None: this
    was the last). A page may hold fewer documents than asked when the scan reached its bound first."""

    documents: list[MemoryDocument]
    after: str | None


# Documents one listing call reads at most (what a page costs, whatever the filter keeps).
LIST_SCAN_BOUND = 5000


def page_of(scanned: list[MemoryDocument], keep: filters.Filter, now: int, limit: int) -> Page:
    """The page a listing makes of the documents it scanned in id order (at most LIST_SCAN_BOUND, after the
    page token): the first `limit` unexpired ones the filter keeps; the next page starts after the last one
    kept, or after the last one scanned when the scan stopped at its bound."""
    found: list[MemoryDocument] = []
    for document in scanned:
        if not document.expired(now) and filters.matches(keep, document.fields()):
            found.append(document)
            if len(found) == limit:
                return Page(found, document.id)
    return Page(found, scanned[-1].id if len(scanned) == LIST_SCAN_BOUND else None)


# Expired documents one purge removes at most (the next one goes on).
PURGE_BOUND = 1000


def check_request_size(documents: list[MemoryDocument], limit: int) -> None:
    """Refuses one call's documents past retrieval.max_memory_bytes_per_request (INVALID_ARGUMENT, LIMIT_EXCEEDED)."""
    size = sum(d.size() for d in documents)
    if size > limit:
        raise invalid(
            [
                Violation(
                    "documents",
                    f"{size} bytes exceed the limit of {limit} bytes per call (retrieval.max_memory_bytes_per_request)",
                    "LIMIT_EXCEEDED",
                )
            ],
            "LIMIT_EXCEEDED",
        )


@dataclass(frozen=True)
class Prepared:
    """Documents' chunks with their vectors, as one embedder and one lexical analysis made them: what a write
    stores in the space of (`model`, `analysis`). A chunk's `provenance.document_id` names its document."""

    model: str
    analysis: str  # a lexical.LANGUAGES name
    chunks: list[Chunk]
    vectors: np.ndarray  # float32 [len(chunks), dimensions]


# The catalog's chunk-and-embed, run before a write's transaction: (scope, source name, units) -> Prepared.
Prepare = Callable[[Scope, str, list[Unit]], Awaitable[Prepared]]


@dataclass(frozen=True)
class PartitionIndex:
    """A partition's searchable index for one model and analysis, caught up with every acknowledged write, and
    how many documents the partition holds."""

    index: HybridIndex
    documents: int


class DocumentStore(Protocol):
    """Documents written by id, one partition per (tenant, session, source name)."""

    async def units(self, scope: Scope, name: str) -> list[Unit]:
        """Every document of the partition, in the order first written."""

    async def count(self, scope: Scope, name: str) -> int: ...

    async def upsert(self, scope: Scope, name: str, documents: list[MemoryDocument]) -> UpsertOutcome:
        """Adds or replaces documents by id; durable when it returns. Unchanged documents cost nothing."""

    async def delete(self, scope: Scope, name: str, ids: list[str]) -> DeleteOutcome: ...

    async def get(self, scope: Scope, name: str, ids: list[str], now: int) -> list[MemoryDocument]:
        """The documents of those ids not expired at `now` (nanoseconds), each once, in the order asked."""

    async def page(self, scope: Scope, name: str, keep: filters.Filter, after: str, limit: int, now: int) -> Page:
        """Up to `limit` documents past id `after` (UTF-8 byte order) that `keep` keeps and that have not expired
        at `now`, reading at most LIST_SCAN_BOUND documents."""

    async def delete_matching(self, scope: Scope, name: str, keep: filters.Filter) -> DeleteOutcome:
        """Deletes every document `keep` keeps (expired ones included)."""

    async def purge(self, now: int) -> int:
        """Deletes up to PURGE_BOUND documents expired at `now`, in every partition; returns how many."""

    async def clear(self, scope: Scope, name: str) -> None:
        """Empties the partition."""

    async def drop(self, scope: Scope, name: str) -> None:
        """Forgets the partition entirely (a closed chat binding)."""

    async def index(self, scope: Scope, name: str, model: str, analysis: str) -> PartitionIndex:
        """The partition's index for the embedder fingerprint `model` and lexical `analysis`, with every write
        acknowledged before this call in it (on any replica). Documents never embedded with that model (written
        under another, or migrated) are chunked and embedded first."""


@dataclass(frozen=True)
class Binding:
    """An open chat binding (chat/open_bindings.py): an owner's live corpus of one source name."""

    id: str
    owner_id: str
    scope: Scope
    source: str
    top_k: int
    declared: bool
    handle_digest: bytes = field(default=b"", repr=False, compare=False)
    # The handle itself: set only on the binding OpenBinding returns, never kept.
    handle: str = field(default="", repr=False, compare=False)

    @property
    def entry(self) -> Entry:
        """The binding as a SEARCH source; hits name it by id until the turn renames them to `source`."""
        return Entry(self.id, SourceType.BINDING, Use.SEARCH, top_k=self.top_k)


class BindingRegistry(Protocol):
    """Where the open bindings are kept, least recently used first; `use` makes one the most recent."""

    async def add(self, binding: Binding, max_open: int) -> list[Binding]:
        """Keeps the binding; removes and returns the least recently used others past `max_open`."""

    async def find(self, binding_id: str, tenant: str) -> Binding | None:
        """The open binding with that id (`tenant` is the caller's, for the database's row security)."""

    async def use(self, binding: Binding) -> None: ...

    async def remove(self, binding: Binding) -> bool:
        """False when it was no longer open (closed meanwhile, here or elsewhere)."""

    async def remove_idle(self, idle_seconds: float) -> list[Binding]:
        """Removes and returns the bindings unused for `idle_seconds`."""

    async def count(self) -> int: ...


class CursorPositions(Protocol):
    async def take(self, key: str, tenant: str, units: int) -> int | None:
        """The cursor's position, which then moves on by one; None (and no move) once it reached `units`."""


class VectorCache(Protocol):
    """Vectors embedded before, by (partition, model fingerprint, chunk content hash); partition "" is every
    tenant's."""

    async def fetch(self, partition: str, model: str, hashes: list[str]) -> dict[str, np.ndarray]: ...

    async def keep(self, partition: str, model: str, vectors: dict[str, np.ndarray]) -> None: ...


class LocalVectors:
    """No vectors shared with other replicas: the catalog's own cache is all there is."""

    async def fetch(self, partition: str, model: str, hashes: list[str]) -> dict[str, np.ndarray]:
        return {}

    async def keep(self, partition: str, model: str, vectors: dict[str, np.ndarray]) -> None:
        return None


class Backend(Protocol):
    """One storage backend: makes every part above, and says whether it can serve."""

    name: str

    @property
    def healthy(self) -> bool:
        """False while the backend cannot serve (its database is unreachable)."""

    def on_health_change(self, callback: Callable[[bool], None]) -> None: ...

    async def start(self) -> None:
        """Connects (and migrates); before any part is used."""

    async def close(self) -> None: ...

    def documents(self, namespace: Namespace, prepare: Prepare) -> DocumentStore: ...

    def binding_registry(self, clock: Callable[[], float]) -> BindingRegistry: ...

    def cursor_positions(self, limit: int) -> CursorPositions: ...

    def vector_cache(self) -> VectorCache: ...
