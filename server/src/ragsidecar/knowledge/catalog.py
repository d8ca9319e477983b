"""Knowledge sources, loaded and indexed: cached by content (never by caller) and persisted.

A source's identity is its name, type and location; its index key hashes what went into it (files with
their sizes and modification times, and the model fingerprint: the embedder's files, pooling, max_length,
query prefix and chunking settings, so that a model reload never mixes vectors of two encoders). An
unchanged source is served from memory, or from its persisted index after a restart; a changed one is
updated in place, re-reading, re-chunking and re-embedding only the files that changed (the embedding cache
spares chunks whose text is unchanged). A source whose reload fails is served from its last good index and says
so (stale fallback). Every key built from caller ids goes through `key_of`.

A DIRECTORY source's key is not computed again while a file watcher on its folder has seen no change since the
last scan (watch.py), so that searching an unchanged source costs the same at 100 and 100k files; unwatched, it
is scanned again once its last scan is older than retrieval.rescan_interval_s; a caller may ask for a rescan.

MEMORY and chat-binding sources are the storage backend's (knowledge/storage.py): each partition's index is
kept caught up with every acknowledged write by its document store, and the catalog only asks for it.

Loaded indexes (each the last good one of its source) live in an LRU bounded by their estimated bytes
(retrieval.index_cache_bytes); an evicted source is read back from disk on its next use, and has no stale
fallback until then. A build runs as its own task
that every caller awaits shielded, so a caller that cancels never fails the others sharing the build.
Start-up sweeps what killed writes left and indexes superseded by newer ones of the same source.

The catalog orchestrates; the jobs it calls on live beside it: path security (roots.py), reading files and
their states (file_states.py), index keys and identities (index_keys.py), the embedding caches (chunk_vectors.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ragsidecar import metrics, tracing
from ragsidecar.cache import ByteLRU
from ragsidecar.config import Config
from ragsidecar.errors import ErrorKind, SidecarError
from ragsidecar.inference.models import BiEncoder
from ragsidecar.inference.registry import ModelRegistry
from ragsidecar.knowledge import index_files
from ragsidecar.knowledge.chunk_vectors import ChunkVectors
from ragsidecar.knowledge.chunking import Chunk, chunk_meta, chunk_units
from ragsidecar.knowledge.declarations import Entry, Scope, SourceType, Use
from ragsidecar.knowledge.file_states import FileState, SourceFiles
from ragsidecar.knowledge.index import HybridIndex, IndexCorrupt, IndexedChunk
from ragsidecar.knowledge.index_keys import index_key, model_fingerprint, source_identity
from ragsidecar.knowledge.roots import KnowledgeRoots
from ragsidecar.knowledge.sources.files import inline_units
from ragsidecar.knowledge.sources.units import SourceError, Unit
from ragsidecar.knowledge.storage import Backend, DocumentStore, Prepared
from ragsidecar.knowledge.watch import Changes, SourceWatches

log = logging.getLogger(__name__)

# Estimated bytes of a loaded index per byte of its float32 vectors: the vectors, the HNSW graph and copy.
_INDEX_BYTES_PER_VECTOR_BYTE = 2


@dataclass(frozen=True)
class Stale:
    reason: str
    built_at: dt.datetime


# A FILE or DIRECTORY source's files, each with its state, as a scan listed and stat'ed them.
Listing = tuple[tuple[Path, os.stat_result], ...]


@dataclass(frozen=True)
class Scan:
    """A source's files as last listed and stat'ed: its index key, when the scan began (time.monotonic) and, for a
    watched DIRECTORY source, its watch's changes before it began. `listing`, the files it stat'ed, goes to the
    update it leads to (so that an edit lists the folder once), never into the cache of sources."""

    key: str
    at: float
    changes: Changes | None = None
    listing: Listing = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class FileChunks:
    """The chunk ids of each file in a FILE or DIRECTORY index (by provenance path), and the position its next new
    chunk takes, so that an update finds the chunks of changed files without reading every chunk of the index."""

    ids: Mapping[str, tuple[str, ...]]
    next_position: int

    @classmethod
    def of(cls, chunks: list[IndexedChunk]) -> FileChunks:
        ids: dict[str, list[str]] = {}
        for chunk in chunks:
            ids.setdefault(chunk.meta.get("file", ""), []).append(chunk.id)
        last = max((int(c.meta.get("position", -1)) for c in chunks), default=-1)
        return cls({file: tuple(held) for file, held in ids.items()}, last + 1)

    def replaced(self, outdated: set[str], added: list[IndexedChunk]) -> FileChunks:
        """After an update that removed the chunks of the `outdated` files and added `added`."""
        kept = FileChunks({f: held for f, held in self.ids.items() if f not in outdated}, self.next_position)
        new = FileChunks.of(added)
        return FileChunks({**kept.ids, **new.ids}, max(self.next_position, new.next_position))


@dataclass
class _Save:
    """A source's index to write to disk (None: it is there already), the superseded index folders of the source to
    remove once it is, and who waits for it."""

    key: str
    index: HybridIndex | None
    gone: set[str]
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


@dataclass(frozen=True)
class LoadedSource:
    name: str
    documents: int  # units (files' records and sections, MEMORY documents) the index was made of
    index: HybridIndex
    built_at: dt.datetime
    # The model fingerprint its vectors came from: a query is searched in it only with a vector of the same.
    model: str
    # FILE and DIRECTORY sources: each file's state when indexed (absolute path -> state), to update by file.
    files: Mapping[str, FileState] = field(default_factory=dict)
    stale: Stale | None = None
    # FILE and DIRECTORY sources: its chunks by file (None: not known yet, read from the index when first needed).
    file_chunks: FileChunks | None = None


class Catalog:
    def __init__(self, config: Config, registry: ModelRegistry, backend: Backend) -> None:
        self._config = config
        self._registry = registry
        # The storage backend (store/factory.py): MEMORY documents, bindings' corpora, shared vectors.
        self.backend = backend
        # Path security: every FILE and DIRECTORY path, and each file listed, resolves inside a root.
        self.roots = KnowledgeRoots(config.knowledge_roots())
        retrieval = config.retrieval
        self._files = SourceFiles(self.roots, retrieval.max_file_bytes)
        self._index_dir = config.resolve(config.paths.data_dir) / "indexes"
        self.memory = backend.documents("memory", functools.partial(self._prepared, SourceType.MEMORY))
        self.bindings = backend.documents("binding", functools.partial(self._prepared, SourceType.BINDING))
        # Source identity -> (its last scan, its last good source).
        self._sources: ByteLRU[str, tuple[Scan, LoadedSource]] = ByteLRU(retrieval.index_cache_bytes)
        metrics.track_size("indexes", self._sources)
        self._watches = SourceWatches(retrieval.watch_files, retrieval.max_watched_sources)
        self._vectors = ChunkVectors(backend.vector_cache())
        self._building: dict[str, asyncio.Task[LoadedSource]] = {}
        # Index saves not begun, by source identity (one each: a newer save of a source replaces its older one),
        # written one at a time in this order by the `_saving` task.
        self._unsaved: dict[str, _Save] = {}
        self._saving: asyncio.Task[None] | None = None
        # Called with (source name, chunks embedded, chunks to embed) as a build advances (the CLI's bar).
        self.on_progress: Callable[[str, int, int], None] | None = None
        self._sweep_leftovers()

    def _sweep_leftovers(self) -> None:
        """Removes what index saves killed mid-way left, and indexes superseded by newer ones (one log line).
        (The document stores leave nothing to sweep: their databases roll back a write killed mid-way.)"""
        try:
            count, size = index_files.sweep(self._index_dir)
        except OSError as err:  # leftovers cost disk space only: never a reason not to start
            log.warning("start-up sweep of leftovers stopped: %s", err)
            return
        metrics.LEFTOVERS_SWEPT.inc(count)
        log.info("start-up sweep removed %d leftover index folders (%d bytes)", count, size)

    # -- units (DIRECT, SEQUENTIAL, counts) ---------------------------------------------------------

    async def units(self, entry: Entry, scope: Scope) -> list[Unit]:
        """Every unit of the source in source order (raises FileNotFoundError, SourceError)."""
        if entry.type is SourceType.INLINE:
            return await asyncio.to_thread(inline_units, entry.inline_text)  # line counts of what may be megabytes
        if (store := self._documents(entry)) is not None:
            return await store.units(scope, entry.name)
        return await asyncio.to_thread(self._files.units, entry)

    def _documents(self, entry: Entry) -> DocumentStore | None:
        """The document store a MEMORY or binding source lives in (None for the others)."""
        stores: dict[SourceType | None, DocumentStore] = {
            SourceType.MEMORY: self.memory,
            SourceType.BINDING: self.bindings,
        }
        return stores.get(entry.type)

    # -- indexes (SEARCH) ------------------------------------------------------------------------

    async def load(self, entry: Entry, scope: Scope, rescan: bool = False) -> LoadedSource:
        """The source's index, built or reused; a failed reload falls back to the last good index. `rescan`: a
        DIRECTORY source's files are listed and stat'ed even when its watch saw no change."""
        if (store := self._documents(entry)) is not None:
            model = self._model_fingerprint(self._embedder())
            partition = await store.index(scope, entry.name, model, self._config.retrieval.lexical_language)
            return LoadedSource(entry.name, partition.documents, partition.index, dt.datetime.now(dt.UTC), model)
        identity = source_identity(entry)
        try:
            embedder = self._embedder()
            model = self._model_fingerprint(embedder)
            held = self._sources.get(identity)
            if held is not None and not rescan and held[1].model == model and self._unchanged(entry, identity, held[0]):
                return held[1]
            scan = await asyncio.to_thread(self._scan, entry, identity, model)
            held = self._sources.get(identity)
            if held is not None and held[0].key == scan.key:
                self._sources.put(identity, (replace(scan, listing=()), held[1]), held[1].index.nbytes())
                return held[1]
            return await self._build_once(scan, identity, entry, scope, embedder, model)
        except (SourceError, OSError) as err:
            held = self._sources.get(identity)
            if held is None or isinstance(err, FileNotFoundError):
                raise
            last = held[1]
            log.warning("source %s failed to reload (%s); serving its last good index", entry.name, err)
            return replace(last, stale=Stale(str(err), last.built_at))

    def forget(self, entry: Entry, scope: Scope) -> None:
        """Drops the source's index from memory; the next load rebuilds it (embeddings stay cached)."""
        self._sources.pop(source_identity(entry))  # a watch of its folder goes with the next build's release

    def _unchanged(self, entry: Entry, identity: str, scan: Scan) -> bool:
        """Whether the source's files are as its last scan found them without listing them: a DIRECTORY source
        whose watch saw no change since, or, not watched, scanned less than retrieval.rescan_interval_s ago.
        (A FILE source is one stat away from certainty; an INLINE one's key is its text.)"""
        if entry.type is not SourceType.DIRECTORY:
            return False
        if scan.changes is not None:
            return self._watches.changes(identity) == scan.changes
        return time.monotonic() - scan.at < self._config.retrieval.rescan_interval_s

    def _scan(self, entry: Entry, identity: str, model: str) -> Scan:
        """The source's files listed and stat'ed (a DIRECTORY source's folder watched first, so that a change
        made during the scan is seen by the next load). Blocking: runs on a worker thread."""
        started = time.monotonic()
        changes = None
        if entry.type is SourceType.DIRECTORY:
            metrics.SOURCE_SCANS.inc()
            changes = self._watches.watch(identity, self.roots.folder_of(entry))
        elif entry.type is SourceType.FILE:
            metrics.SOURCE_SCANS.inc()
        listing = self._listing(entry)
        return Scan(index_key(entry, model, self._config.retrieval, listing), started, changes, listing)

    async def _build_once(
        self, scan: Scan, identity: str, entry: Entry, scope: Scope, embedder: BiEncoder, model: str
    ) -> LoadedSource:
        """Concurrent loads of one source share a single build, run as a task of its own: a caller that is
        cancelled stops waiting, and the build goes on for the others (and for the next caller)."""
        build = self._building.get(scan.key)
        if build is None:
            build = asyncio.create_task(
                self._build_and_keep(scan, identity, entry, scope, embedder, model), name=f"index build of {entry.name}"
            )
            self._building[scan.key] = build
            build.add_done_callback(functools.partial(self._build_done, scan.key))
        else:
            metrics.INDEX_BUILDS_JOINED.inc()
        return await asyncio.shield(build)

    def _build_done(self, key: str, build: asyncio.Task[LoadedSource]) -> None:
        del self._building[key]
        if not build.cancelled():
            build.exception()  # retrieved here, so a failure nobody awaited any more is not logged as lost

    async def _build_and_keep(
        self, scan: Scan, identity: str, entry: Entry, scope: Scope, embedder: BiEncoder, model: str
    ) -> LoadedSource:
        previous = self._sources.get(identity)
        source, how = await self._build(scan, entry, scope, embedder, model, previous and previous[1])
        self._sources.put(identity, (replace(scan, listing=()), source), source.index.nbytes() if source.index else 0)
        await asyncio.to_thread(self._release_evicted)  # unwatching a folder removes a watch per subfolder
        # An index superseded by a newer one of the same source is of no further use, on disk too. An updated
        # index is saved after the search that asked for it; a built one before (its folder is its cache).
        superseded = previous[0].key if previous is not None and previous[0].key != scan.key else None
        done = asyncio.get_running_loop().create_future() if how == "built" else None
        self._save(identity, scan.key, None if how == "disk" else source.index, superseded, done)
        if done is not None:
            await done
        return source

    def _save(
        self,
        identity: str,
        key: str,
        index: HybridIndex | None,
        superseded: str | None,
        done: asyncio.Future[None] | None,
    ) -> None:
        """Queues the source's index for writing (None: on disk already) and its superseded folder for removal,
        after every save queued before it; `done` resolves once both are (a failure is logged either way)."""
        save = _Save(key, index, {superseded} if superseded else set(), [done] if done else [])
        if (earlier := self._unsaved.pop(identity, None)) is not None:  # never begun: the newer one replaces it
            save.gone |= earlier.gone | {earlier.key}
            save.waiters += earlier.waiters
            save.index = save.index if save.index is not None or earlier.key != key else earlier.index
        save.gone.discard(key)
        self._unsaved[identity] = save
        if self._saving is None or self._saving.done():
            self._saving = asyncio.create_task(self._write_saves(), name="index saves")

    async def _write_saves(self) -> None:
        while self._unsaved:
            identity = next(iter(self._unsaved))
            save = self._unsaved.pop(identity)
            try:
                await asyncio.to_thread(self._write, identity, save)
            except OSError as err:
                log.warning("index save to %s failed: %s", self._index_dir / save.key, err)
                for waiter in save.waiters:
                    if not waiter.done():
                        waiter.set_exception(err)
            else:
                for waiter in save.waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    def _write(self, identity: str, save: _Save) -> None:
        if save.index is not None:
            save.index.save(self._index_dir / save.key, identity)
        for key in save.gone:
            shutil.rmtree(self._index_dir / key, True)

    async def close(self) -> None:
        """Writes the index saves still queued (a clean stop leaves every index on disk), then stops watching."""
        while self._saving is not None and not self._saving.done():
            await asyncio.shield(self._saving)
        await asyncio.to_thread(self._watches.close)

    def _release_evicted(self) -> None:
        """Stops watching the folders of sources whose indexes the LRU evicted or `forget` dropped."""
        for identity in self._watches.watched():
            if identity not in self._sources:
                self._watches.release(identity)

    async def _build(
        self, scan: Scan, entry: Entry, scope: Scope, embedder: BiEncoder, model: str, last: LoadedSource | None
    ) -> tuple[LoadedSource, str]:
        """The source's index and how it was made: read back from disk, updated from `last` (the files changed
        since the scan's listing) or built (neither saved yet)."""
        folder = self._index_dir / scan.key
        if folder.exists():
            try:
                return await self._read_back(folder, entry, scope, model), "disk"
            except IndexCorrupt as err:
                log.warning("index of %s at %s is corrupt (%s); rebuilding it", entry.name, folder, err)
            except FileNotFoundError:  # removed while read: a save superseded it (its key came back), so it is gone
                log.info("index of %s at %s went while it was read; updating or building it", entry.name, folder)
        if last is not None and self._updatable(entry, last, model):
            return await self._update(entry, scope, embedder, model, last, scan.listing), "updated"
        return await self._build_whole(entry, scope, embedder, model), "built"

    async def _read_back(self, folder: Path, entry: Entry, scope: Scope, model: str) -> LoadedSource:
        files, units = await self._units_by_file(entry, scope)
        with tracing.span("index load", source=entry.name) as span:
            index = await asyncio.to_thread(HybridIndex.load, folder, self._config.retrieval.index_threads)
            span.set(chunks=len(index))
        built = dt.datetime.fromtimestamp(folder.stat().st_mtime, dt.UTC)
        metrics.INDEX_LOADS.labels("disk").inc()
        self._vectors.remember(index, model)
        return LoadedSource(entry.name, len(units), index, built, model, files)

    async def _build_whole(self, entry: Entry, scope: Scope, embedder: BiEncoder, model: str) -> LoadedSource:
        with tracing.span("index build", source=entry.name, model=embedder.id) as span:
            files, units = await self._units_by_file(entry, scope)
            with embedder.in_use():
                chunks = await asyncio.to_thread(self._chunk, entry.name, units, embedder)
                vectors = await self._vectors.embed(
                    entry.name, chunks, embedder, model, self._embedding_partition(entry, scope), self.on_progress
                )
            indexed = [IndexedChunk(c.id, c.text, chunk_meta(c)) for c in chunks]
            index = await asyncio.to_thread(self._index, indexed, vectors)
            span.set(units=len(units), chunks=len(chunks))
        metrics.INDEX_LOADS.labels("built").inc()
        return LoadedSource(
            entry.name, len(units), index, dt.datetime.now(dt.UTC), model, files, file_chunks=FileChunks.of(indexed)
        )

    async def _units_by_file(self, entry: Entry, scope: Scope) -> tuple[dict[str, FileState], list[Unit]]:
        """Every unit of the source, and (FILE and DIRECTORY) the state of each file read."""
        if entry.type not in (SourceType.FILE, SourceType.DIRECTORY):
            return {}, await self.units(entry, scope)
        return await asyncio.to_thread(self._files.units_by_file, entry)

    def _updatable(self, entry: Entry, last: LoadedSource, model: str) -> bool:
        """Whether `last` can be brought up to date file by file: the same files-based source, the same vectors
        and the same index settings (anything else rebuilds it whole)."""
        retrieval = self._config.retrieval
        return (
            entry.type in (SourceType.FILE, SourceType.DIRECTORY)
            and bool(last.files)
            and last.model == model
            and last.index.dtype == retrieval.index_dtype
            and last.index.lexical_language == retrieval.lexical_language
        )

    async def _update(
        self, entry: Entry, scope: Scope, embedder: BiEncoder, model: str, last: LoadedSource, listing: Listing
    ) -> LoadedSource:
        """`last` with the files of `listing` changed since re-read, re-chunked and re-embedded, and the chunks of
        changed and removed files replaced in its index: a change costs what the changed files hold. New chunks
        take positions after every chunk the index has held, so chunk ids stay unique."""
        with tracing.span("index update", source=entry.name, model=embedder.id):
            files, units, outdated = await asyncio.to_thread(self._files.changed, listing, last.files)
            layout = last.file_chunks
            if layout is None:  # read back from disk: its chunks read once
                layout = FileChunks.of(await asyncio.to_thread(last.index.chunks))
            removed = [chunk for file in outdated for chunk in layout.ids.get(file, ())]
            with embedder.in_use():
                chunks = await asyncio.to_thread(self._chunk, entry.name, units, embedder, layout.next_position)
                vectors = await self._vectors.embed(
                    entry.name, chunks, embedder, model, self._embedding_partition(entry, scope), self.on_progress
                )
            added = [IndexedChunk(c.id, c.text, chunk_meta(c)) for c in chunks]
            await asyncio.to_thread(last.index.update, removed, added, vectors)
        metrics.INDEX_LOADS.labels("updated").inc()
        return LoadedSource(
            entry.name,
            sum(f.units for f in files.values()),
            last.index,
            dt.datetime.now(dt.UTC),
            model,
            files,
            file_chunks=layout.replaced(outdated, added),
        )

    async def _prepared(self, source_type: SourceType, scope: Scope, name: str, units: list[Unit]) -> Prepared:
        """Documents chunked and embedded for a document store, before its write transaction; the embedding
        caches spare the texts embedded before."""
        embedder = self._embedder()
        model = self._model_fingerprint(embedder)
        with embedder.in_use():
            chunks = await asyncio.to_thread(self._chunk, name, units, embedder)
            vectors = await self._vectors.embed(
                name,
                chunks,
                embedder,
                model,
                self._embedding_partition(Entry(name, source_type, Use.SEARCH), scope),
                self.on_progress,
            )
        return Prepared(model, self._config.retrieval.lexical_language, chunks, vectors)

    def _chunk(self, name: str, units: list[Unit], embedder: BiEncoder, first_position: int = 0) -> list[Chunk]:
        retrieval = self._config.retrieval
        return chunk_units(
            name,
            units,
            embedder.encoder.tokenizer,
            retrieval.chunk_tokens,
            retrieval.chunk_overlap_tokens,
            first_position,
        )

    def index_folder(self, entry: Entry, scope: Scope) -> Path:
        """Where the index of that source, as it is now, is persisted."""
        return self._index_dir / self._key(entry, self._model_fingerprint(self._embedder()))

    def _index(self, indexed: list[IndexedChunk], vectors: np.ndarray) -> HybridIndex:
        retrieval = self._config.retrieval
        return HybridIndex.build(
            indexed,
            vectors,
            threads=retrieval.index_threads,
            dtype=retrieval.index_dtype,
            lexical_language=retrieval.lexical_language,
        )

    def _embedding_partition(self, entry: Entry, scope: Scope) -> str:
        """Whose cached vectors a source's chunks are: "" (every tenant's) unless [store] share_embeddings is
        "tenant" and the text is the caller's; files under the roots are the operator's (store/embeddings.py)."""
        if self._config.store.share_embeddings == "all" or entry.type in (SourceType.FILE, SourceType.DIRECTORY):
            return ""
        return scope.tenant

    async def query_vector(self, query: str) -> tuple[np.ndarray, str]:
        """The query's embedding, and the fingerprint of the model that made it (a loaded source's `model`)."""
        embedder = self._embedder()
        with embedder.in_use():
            vectors, *_ = await embedder.embed([self._config.retrieval.query_prefix + query])
        return vectors[0], self._model_fingerprint(embedder)

    # -- keys ------------------------------------------------------------------------------------

    def _embedder(self) -> BiEncoder:
        return self._registry.embedder(self._config.retrieval.embedder)

    def _model_fingerprint(self, embedder: BiEncoder) -> str:
        return model_fingerprint(embedder, self._config.retrieval)

    def _key(self, entry: Entry, model: str) -> str:
        """The index key of the source as it is now, its files stat'ed afresh."""
        return index_key(entry, model, self._config.retrieval, self._listing(entry))

    def _listing(self, entry: Entry) -> Listing:
        """A FILE or DIRECTORY source's files, each stat'ed now (nothing for the others)."""
        files = self.roots.files_of(entry) if entry.type in (SourceType.FILE, SourceType.DIRECTORY) else []
        return tuple((file, self.roots.stat(file)) for file in files)


def source_error(name: str, err: Exception) -> SidecarError:
    """A load failure as the API reports it: a missing file is not ready, anything else unreadable."""
    if isinstance(err, FileNotFoundError):
        return SidecarError(
            ErrorKind.FAILED_PRECONDITION,
            "KNOWLEDGE_NOT_READY",
            f"knowledge source {name!r} has no file at {err}",
            metadata={"sources": name},
        )
    if isinstance(err, SourceError) and err.reason == "LIMIT_EXCEEDED":
        return SidecarError(
            ErrorKind.FAILED_PRECONDITION,
            "LIMIT_EXCEEDED",
            f"knowledge source {name!r}: {err}",
            metadata={"sources": name},
        )
    return SidecarError(
        ErrorKind.FAILED_PRECONDITION,
        "SOURCE_UNREADABLE",
        f"knowledge source {name!r}: {err}",
        metadata={"sources": name},
    )
