"""Knowledge sources, loaded and indexed: cached by content (never by caller) and persisted.

A source's identity is its name, type and location; its index key hashes what went into it (files with
their sizes and modification times, and the model fingerprint: the embedder's files, pooling, max_length,
query prefix and chunking settings, so that a model reload never mixes vectors of two encoders). An
unchanged source is served from memory, or from its persisted index after a restart; a changed one is
updated in place, re-reading, re-chunking and re-embedding only the files that changed (the embedding cache
spares chunks whose text is unchanged). A source whose reload fails is served from its last good index and says
so (stale fallback). Every key built from caller ids goes through `key_of`.

MEMORY and chat-binding sources are the storage backend's (store/interface.py): each partition's index is
kept caught up with every acknowledged write by its document store, and the catalog only asks for it.

Loaded indexes (each the last good one of its source) live in an LRU bounded by their estimated bytes
(retrieval.index_cache_bytes); an evicted source is read back from disk on its next use, and has no stale
fallback until then. A build runs as its own task
that every caller awaits shielded, so a caller that cancels never fails the others sharing the build.
Start-up sweeps what killed writes left and indexes superseded by newer ones of the same source.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import functools
import glob
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
from ragsidecar.errors import ErrorKind, SidecarError, Violation, invalid
from ragsidecar.identifiers import key_of
from ragsidecar.inference.models import BiEncoder
from ragsidecar.inference.registry import ModelRegistry
from ragsidecar.knowledge import index as index_files
from ragsidecar.knowledge.chunking import Chunk, chunk_meta, chunk_units
from ragsidecar.knowledge.declarations import Entry, Scope, SourceType, Use
from ragsidecar.knowledge.index import HybridIndex, IndexCorrupt, IndexedChunk
from ragsidecar.knowledge.sources.files import inline_units, list_files, provenance_path, read_units
from ragsidecar.knowledge.sources.units import SOURCE_UNREADABLE, SourceError, Unit
from ragsidecar.store.interface import Backend, DocumentStore, Prepared

log = logging.getLogger(__name__)

_EMBED_BATCH = 128
_PROGRESS_EVERY_S = 5.0
# Estimated bytes of a loaded index per byte of its float32 vectors: the vectors, the HNSW graph and copy.
_INDEX_BYTES_PER_VECTOR_BYTE = 2
# Longest knowledge path, and longest folder or file name in one, in UTF-8 bytes (Linux's PATH_MAX - 1, NAME_MAX).
MAX_PATH_BYTES = 4095
MAX_NAME_BYTES = 255


@dataclass(frozen=True)
class Stale:
    reason: str
    built_at: dt.datetime


@dataclass(frozen=True)
class FileState:
    """A knowledge file as it was indexed."""

    size: int
    mtime_ns: int
    relative: str  # the provenance path its chunks carry (meta "file")
    units: int


@dataclass(frozen=True)
class LoadedSource:
    name: str
    documents: int  # units (files' records and sections, MEMORY documents) the index was made of
    index: HybridIndex | None
    built_at: dt.datetime
    # The model fingerprint its vectors came from: a query is searched in it only with a vector of the same.
    model: str
    # FILE and DIRECTORY sources: each file's state when indexed (absolute path -> state), to update by file.
    files: Mapping[str, FileState] = field(default_factory=dict)
    stale: Stale | None = None


class Catalog:
    def __init__(self, config: Config, registry: ModelRegistry, backend: Backend) -> None:
        self._config = config
        self._registry = registry
        # The storage backend (store/factory.py): MEMORY documents, bindings' corpora, shared vectors.
        self.backend = backend
        self._roots = config.knowledge_roots()
        retrieval = config.retrieval
        self._index_dir = config.resolve(config.paths.data_dir) / "indexes"
        self.memory = backend.documents("memory", functools.partial(self._prepared, SourceType.MEMORY))
        self.bindings = backend.documents("binding", functools.partial(self._prepared, SourceType.BINDING))
        # Source identity -> (index key, its last good source).
        self._sources: ByteLRU[str, tuple[str, LoadedSource]] = ByteLRU(retrieval.index_cache_bytes)
        self._vectors: ByteLRU[str, np.ndarray] = ByteLRU(256 * 1024 * 1024)
        # Vectors other replicas embedded (the postgres backend's), looked up where self._vectors misses.
        self._shared_vectors = backend.vector_cache()
        self._parsed: ByteLRU[tuple[str, int, int], list[Unit]] = ByteLRU(64 * 1024 * 1024)
        for name, cache in (("indexes", self._sources), ("embeddings", self._vectors), ("parsed_files", self._parsed)):
            metrics.track_size(name, cache)
        self._building: dict[str, asyncio.Task[LoadedSource]] = {}
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

    # -- locations -------------------------------------------------------------------------------

    def resolve_path(self, path: str) -> Path:
        """The path, made absolute against the first root, that must resolve inside a root."""
        if "\x00" in path:
            raise invalid([Violation("path", f"knowledge path {path[:200]!r} contains a NUL character")])
        if too_long := _length_problem(path):
            raise invalid([Violation("path", f"knowledge path {path[:200]!r} is too long: {too_long}")])
        if not self._roots:
            raise _outside(path, "no knowledge roots are configured")
        try:
            candidate = Path(path).expanduser()
        except RuntimeError:  # "~nosuchuser/...": a home that does not exist cannot be inside a root
            raise _outside(path, "its home directory is unknown") from None
        if not candidate.is_absolute():
            candidate = self._roots[0] / candidate
        prefix = _glob_prefix(candidate)
        self._check_inside(_resolved(prefix, path), path)
        return candidate

    def _check_inside(self, resolved: Path, shown: str) -> None:
        if not any(resolved == root.resolve() or resolved.is_relative_to(root.resolve()) for root in self._roots):
            raise _outside(shown, "it resolves outside the configured knowledge roots")

    def files_of(self, entry: Entry) -> list[Path]:
        """The files a FILE or DIRECTORY entry reads; every one checked inside the roots after symlinks."""
        location = self.resolve_path(entry.path)
        try:
            if entry.type is SourceType.FILE and not location.is_file():
                raise FileNotFoundError(entry.path)
            files = [location] if entry.type is SourceType.FILE else list_files(location)
        except OSError as err:
            raise _unreadable(entry.path, err) from None
        for file in files:
            shown = self._shown(file)
            self._check_inside(_resolved(file, shown), shown)
        return files

    def _shown(self, file: Path) -> str:
        """How errors name a file: relative to the knowledge root holding it (never the server's own folders), else
        as the caller sent it (an absolute path of theirs)."""
        return next(
            (file.relative_to(root).as_posix() for root in self._roots if file.is_relative_to(root)), file.as_posix()
        )

    def _stat(self, file: Path) -> os.stat_result:
        try:
            return file.stat()
        except OSError as err:  # a file listed a moment ago, removed or made unreadable since
            raise _unreadable(self._shown(file), err) from None

    # -- units (DIRECT, SEQUENTIAL, counts) ---------------------------------------------------------

    async def units(self, entry: Entry, scope: Scope) -> list[Unit]:
        """Every unit of the source in source order (raises FileNotFoundError, SourceError)."""
        if entry.type is SourceType.INLINE:
            return await asyncio.to_thread(inline_units, entry.inline_text)  # line counts of what may be megabytes
        if (store := self._documents(entry)) is not None:
            return await store.units(scope, entry.name)
        return await asyncio.to_thread(self._read_files, entry)

    def _documents(self, entry: Entry) -> DocumentStore | None:
        """The document store a MEMORY or binding source lives in (None for the others)."""
        return {SourceType.MEMORY: self.memory, SourceType.BINDING: self.bindings}.get(entry.type)

    def _read_files(self, entry: Entry) -> list[Unit]:
        return [unit for file in self.files_of(entry) for unit in self._read_file(file)[1]]

    def _read_file(self, file: Path) -> tuple[FileState, list[Unit]]:
        """One file's units, and its state as read; an unchanged file (same size and modification time) is not
        parsed again, since DIRECT and SEQUENTIAL sources are read on every dispatch."""
        stat = self._stat(file)
        key = (str(file), stat.st_size, stat.st_mtime_ns)
        root = next(r for r in self._roots if _resolved(file, self._shown(file)).is_relative_to(r.resolve())).resolve()
        parsed = self._parsed.get(key)
        if parsed is None:
            parsed = read_units(file, root, self._config.retrieval.max_file_bytes)
            self._parsed.put(key, parsed, sum(len(u.text) for u in parsed))
        return FileState(stat.st_size, stat.st_mtime_ns, provenance_path(file, root), len(parsed)), parsed

    def _read_changed(self, entry: Entry, last: LoadedSource) -> tuple[dict[str, FileState], list[Unit], set[str]]:
        """The files of the entry now, the units of those changed since `last` was indexed (new, or another
        size or modification time), and the provenance paths whose chunks `last` holds out of date."""
        files, units, outdated = {}, [], set()
        for file in self.files_of(entry):
            held = last.files.get(str(file))
            stat = self._stat(file)
            if held is not None and (held.size, held.mtime_ns) == (stat.st_size, stat.st_mtime_ns):
                files[str(file)] = held
                continue
            state, parsed = self._read_file(file)
            files[str(file)], units = state, units + parsed
            outdated |= {state.relative} | ({held.relative} if held else set())
        outdated |= {state.relative for path, state in last.files.items() if path not in files}
        return files, units, outdated

    # -- indexes (SEARCH) ------------------------------------------------------------------------

    async def load(self, entry: Entry, scope: Scope) -> LoadedSource:
        """The source's index, built or reused; a failed reload falls back to the last good index."""
        if (store := self._documents(entry)) is not None:
            model = self._model_fingerprint(self._embedder())
            partition = await store.index(scope, entry.name, model, self._config.retrieval.lexical_language)
            return LoadedSource(
                entry.name, partition.documents, partition.index, dt.datetime.now(dt.UTC), model
            )
        identity = self._identity(entry, scope)
        try:
            embedder = self._embedder()
            model = self._model_fingerprint(embedder)
            key = await asyncio.to_thread(self._key, entry, scope, model)
            held = self._sources.get(identity)
            if held is not None and held[0] == key:
                return held[1]
            return await self._build_once(key, identity, entry, scope, embedder, model)
        except (SourceError, OSError) as err:
            held = self._sources.get(identity)
            if held is None or isinstance(err, FileNotFoundError):
                raise
            last = held[1]
            log.warning("source %s failed to reload (%s); serving its last good index", entry.name, err)
            return replace(last, stale=Stale(str(err), last.built_at))

    def forget(self, entry: Entry, scope: Scope) -> None:
        """Drops the source's index from memory; the next load rebuilds it (embeddings stay cached)."""
        self._sources.pop(self._identity(entry, scope))

    async def _build_once(
        self, key: str, identity: str, entry: Entry, scope: Scope, embedder: BiEncoder, model: str
    ) -> LoadedSource:
        """Concurrent loads of one source share a single build, run as a task of its own: a caller that is
        cancelled stops waiting, and the build goes on for the others (and for the next caller)."""
        build = self._building.get(key)
        if build is None:
            build = asyncio.create_task(
                self._build_and_keep(key, identity, entry, scope, embedder, model), name=f"index build of {entry.name}"
            )
            self._building[key] = build
            build.add_done_callback(functools.partial(self._build_done, key))
        else:
            metrics.INDEX_BUILDS_JOINED.inc()
        return await asyncio.shield(build)

    def _build_done(self, key: str, build: asyncio.Task[LoadedSource]) -> None:
        del self._building[key]
        if not build.cancelled():
            build.exception()  # retrieved here, so a failure nobody awaited any more is not logged as lost

    async def _build_and_keep(
        self, key: str, identity: str, entry: Entry, scope: Scope, embedder: BiEncoder, model: str
    ) -> LoadedSource:
        previous = self._sources.get(identity)
        source = await self._build(key, identity, entry, scope, embedder, model, previous and previous[1])
        self._sources.put(identity, (key, source), source.index.nbytes() if source.index else 0)
        # An index superseded by a newer one of the same source is of no further use, on disk too.
        if previous is not None and previous[0] != key:
            await asyncio.to_thread(shutil.rmtree, self._index_dir / previous[0], True)
        return source

    async def _build(
        self,
        key: str,
        identity: str,
        entry: Entry,
        scope: Scope,
        embedder: BiEncoder,
        model: str,
        last: LoadedSource | None,
    ) -> LoadedSource:
        """The source's index: read back from disk, updated from `last` (the files changed since), or built."""
        folder = self._index_dir / key
        if folder.exists():
            try:
                return await self._read_back(folder, entry, scope, model)
            except IndexCorrupt as err:
                log.warning("index of %s at %s is corrupt (%s); rebuilding it", entry.name, folder, err)
        if last is not None and self._updatable(entry, last, model):
            source = await self._update(entry, scope, embedder, model, last)
        else:
            source = await self._build_whole(entry, scope, embedder, model)
        await asyncio.to_thread(source.index.save, folder, identity)  # type: ignore[union-attr]
        return source

    async def _read_back(self, folder: Path, entry: Entry, scope: Scope, model: str) -> LoadedSource:
        files, units = await self._units_by_file(entry, scope)
        with tracing.span("index load", source=entry.name) as span:
            index = await asyncio.to_thread(HybridIndex.load, folder, self._config.retrieval.index_threads)
            span.set(chunks=len(index))
        built = dt.datetime.fromtimestamp(folder.stat().st_mtime, dt.UTC)
        metrics.INDEX_LOADS.labels("disk").inc()
        self._remember_vectors(index, model)
        return LoadedSource(entry.name, len(units), index, built, model, files)

    async def _build_whole(self, entry: Entry, scope: Scope, embedder: BiEncoder, model: str) -> LoadedSource:
        with tracing.span("index build", source=entry.name, model=embedder.id) as span:
            files, units = await self._units_by_file(entry, scope)
            with embedder.in_use():
                chunks = await asyncio.to_thread(self._chunk, entry.name, units, embedder)
                vectors = await self._embed_chunks(
                    entry.name, chunks, embedder, model, self._embedding_partition(entry, scope)
                )
            index = await asyncio.to_thread(self._index, chunks, vectors)
            span.set(units=len(units), chunks=len(chunks))
        metrics.INDEX_LOADS.labels("built").inc()
        return LoadedSource(entry.name, len(units), index, dt.datetime.now(dt.UTC), model, files)

    async def _units_by_file(self, entry: Entry, scope: Scope) -> tuple[dict[str, FileState], list[Unit]]:
        """Every unit of the source, and (FILE and DIRECTORY) the state of each file read."""
        if entry.type not in (SourceType.FILE, SourceType.DIRECTORY):
            return {}, await self.units(entry, scope)
        read = await asyncio.to_thread(lambda: [(str(f), self._read_file(f)) for f in self.files_of(entry)])
        return {path: state for path, (state, _) in read}, [u for _, (_, units) in read for u in units]

    def _updatable(self, entry: Entry, last: LoadedSource, model: str) -> bool:
        """Whether `last` can be brought up to date file by file: the same files-based source, the same vectors
        and the same index settings (anything else rebuilds it whole)."""
        retrieval = self._config.retrieval
        return (
            entry.type in (SourceType.FILE, SourceType.DIRECTORY)
            and last.index is not None
            and bool(last.files)
            and last.model == model
            and last.index.dtype == retrieval.index_dtype
            and last.index.lexical_language == retrieval.lexical_language
        )

    async def _update(
        self, entry: Entry, scope: Scope, embedder: BiEncoder, model: str, last: LoadedSource
    ) -> LoadedSource:
        """`last` with the files changed since re-read, re-chunked and re-embedded, and the chunks of changed and
        removed files replaced in its index: a change costs what the changed files hold. New chunks take
        positions after every chunk the index holds, so chunk ids stay unique."""
        index = last.index
        assert index is not None
        with tracing.span("index update", source=entry.name, model=embedder.id):
            return await self._updated(entry, scope, embedder, model, index, last)

    async def _updated(
        self, entry: Entry, scope: Scope, embedder: BiEncoder, model: str, index: HybridIndex, last: LoadedSource
    ) -> LoadedSource:
        files, units, outdated = await asyncio.to_thread(self._read_changed, entry, last)
        held = await asyncio.to_thread(index.chunks)
        removed = [c.id for c in held if c.meta.get("file") in outdated]
        first = 1 + max((int(c.meta.get("position", -1)) for c in held), default=-1)
        with embedder.in_use():
            chunks = await asyncio.to_thread(self._chunk, entry.name, units, embedder, first)
            vectors = await self._embed_chunks(
                entry.name, chunks, embedder, model, self._embedding_partition(entry, scope)
            )
        await asyncio.to_thread(
            index.update, removed, [IndexedChunk(c.id, c.text, chunk_meta(c)) for c in chunks], vectors
        )
        metrics.INDEX_LOADS.labels("updated").inc()
        return LoadedSource(
            entry.name, sum(f.units for f in files.values()), index, dt.datetime.now(dt.UTC), model, files
        )

    async def _prepared(self, source_type: SourceType, scope: Scope, name: str, units: list[Unit]) -> Prepared:
        """Documents chunked and embedded for a document store, before its write transaction; the embedding
        caches spare the texts embedded before."""
        embedder = self._embedder()
        model = self._model_fingerprint(embedder)
        with embedder.in_use():
            chunks = await asyncio.to_thread(self._chunk, name, units, embedder)
            vectors = await self._embed_chunks(
                name, chunks, embedder, model, self._embedding_partition(Entry(name, source_type, Use.SEARCH), scope)
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
        return self._index_dir / self._key(entry, scope, self._model_fingerprint(self._embedder()))

    def _index(self, chunks: list[Chunk], vectors: np.ndarray) -> HybridIndex:
        indexed = [IndexedChunk(c.id, c.text, chunk_meta(c)) for c in chunks]
        retrieval = self._config.retrieval
        return HybridIndex.build(
            indexed,
            vectors,
            threads=retrieval.index_threads,
            dtype=retrieval.index_dtype,
            lexical_language=retrieval.lexical_language,
        )

    async def _embed_chunks(
        self, name: str, chunks: list[Chunk], embedder: BiEncoder, model: str, partition: str
    ) -> np.ndarray:
        """Vectors for the chunks; only texts not embedded before (by content hash), here or (postgres store) by
        any replica, reach the model. `partition` is whose cached vectors these are ("" for every tenant's)."""
        cache_key = key_of(model, partition) if partition else model
        found = {
            c.content_hash: vector
            for c in chunks
            if (vector := self._vectors.get(f"{cache_key}:{c.content_hash}")) is not None
        }
        missing = [c for c in chunks if c.content_hash not in found]
        if missing:
            hashes = list(dict.fromkeys(c.content_hash for c in missing))
            shared = await self._shared_vectors.fetch(partition, model, hashes)
            for digest, vector in shared.items():
                self._vectors.put(f"{cache_key}:{digest}", vector, vector.nbytes)
            found.update(shared)
            missing = [c for c in missing if c.content_hash not in found]
        embedded: dict[str, np.ndarray] = {}
        started, last_report = time.monotonic(), time.monotonic()
        for start in range(0, len(missing), _EMBED_BATCH):
            batch = missing[start : start + _EMBED_BATCH]
            vectors, *_ = await embedder.embed([c.text for c in batch])
            metrics.EMBEDDED_CHUNKS.inc(len(batch))
            for chunk, vector in zip(batch, vectors):
                self._vectors.put(f"{cache_key}:{chunk.content_hash}", vector, vector.nbytes)
                embedded[chunk.content_hash] = vector
            done = start + len(batch)
            if self.on_progress:
                self.on_progress(name, done, len(missing))
            if time.monotonic() - last_report >= _PROGRESS_EVERY_S or done == len(missing):
                last_report = time.monotonic()
                rate = done / max(last_report - started, 1e-9)
                log.info(
                    "indexing %s: embedded %d/%d new chunks (%.1f chunks/s; %d reused)",
                    name,
                    done,
                    len(missing),
                    rate,
                    len(chunks) - len(missing),
                )
        if embedded:
            await self._shared_vectors.keep(partition, model, embedded)
        found.update(embedded)
        dimensions = embedder.dimensions
        return (
            np.stack([found[c.content_hash] for c in chunks]) if chunks else np.zeros((0, dimensions), dtype=np.float32)
        )

    def _embedding_partition(self, entry: Entry, scope: Scope) -> str:
        """Whose cached vectors a source's chunks are: "" (every tenant's) unless [store] share_embeddings is
        "tenant" and the text is the caller's; files under the roots are the operator's (store/embeddings.py)."""
        if self._config.store.share_embeddings == "all" or entry.type in (SourceType.FILE, SourceType.DIRECTORY):
            return ""
        return scope.tenant

    def _remember_vectors(self, index: HybridIndex, model: str) -> None:
        """Seeds the embedding cache from an index read back from disk (keyed on the same model
        fingerprint), so that after a restart a changed source re-embeds only its new chunks."""
        for chunk, vector in zip(index.chunks(), index.vectors()):
            digest = chunk.meta.get("content_hash")
            if digest:
                self._vectors.put(f"{model}:{digest}", vector, vector.nbytes)

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
        """Everything that changes a chunk's or a query's vector: the embedder's files, its pooling and
        max_length (a reload may change them under the same model id), the query prefix, the chunking."""
        retrieval = self._config.retrieval
        return key_of(
            embedder.fingerprint,
            embedder.spec.pooling,
            str(embedder.spec.max_length),
            retrieval.query_prefix,
            str(retrieval.chunk_tokens),
            str(retrieval.chunk_overlap_tokens),
        )

    def _identity(self, entry: Entry, scope: Scope) -> str:
        """One source whatever its content: its name, type and location."""
        return key_of(entry.name, str(entry.type), self._location(entry, scope))

    def _location(self, entry: Entry, scope: Scope) -> str:
        if entry.type is SourceType.INLINE:
            return "inline:" + key_of(entry.inline_text)
        return entry.path

    def _key(self, entry: Entry, scope: Scope, model: str) -> str:
        """Hash of everything the index depends on; equal keys mean an identical index."""
        retrieval = self._config.retrieval
        parts = [self._identity(entry, scope), model, retrieval.index_dtype, retrieval.lexical_language]
        if entry.type in (SourceType.FILE, SourceType.DIRECTORY):
            for file in self.files_of(entry):
                stat = self._stat(file)
                parts += [str(file), str(stat.st_size), str(stat.st_mtime_ns)]
        return key_of(*parts)[:32]


def _resolved(path: Path, shown: str) -> Path:
    """The path after symlinks; a symlink loop (or a path the system cannot resolve) is unreadable."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as err:  # Python 3.11 raises RuntimeError on a loop, later ones OSError
        why = (
            "a symlink loop"
            if isinstance(err, RuntimeError) or getattr(err, "errno", None) == errno.ELOOP
            else f"it cannot be resolved ({err.strerror})"
        )
        raise SidecarError(
            ErrorKind.FAILED_PRECONDITION,
            "SOURCE_UNREADABLE",
            f"knowledge path {shown[:200]!r} is unreadable: {why}",
            metadata={"path": shown[:200]},
        )


def _length_problem(path: str) -> str:
    """Why a path is longer than file systems take (PATH_MAX, NAME_MAX: Linux's, the widest in use), or "".
    Checked before any use, so the system's own error, naming the absolute path tried, never arises."""
    if len(encoded := path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"{len(encoded)} bytes, over the limit of {MAX_PATH_BYTES}"
    longest = max(
        (len(part.encode("utf-8", "surrogatepass")) for part in path.split("/") if not glob.has_magic(part)), default=0
    )
    return f"a name of {longest} bytes, over the limit of {MAX_NAME_BYTES}" if longest > MAX_NAME_BYTES else ""


def _unreadable(shown: str, err: OSError) -> OSError | SourceError:
    """An OSError as sources report it, naming the path as shown: the system's own message names the absolute
    path it tried, which would reveal the server's folders. A missing file stays a FileNotFoundError."""
    if isinstance(err, FileNotFoundError):
        return FileNotFoundError(shown)
    why = "a symlink loop" if err.errno == errno.ELOOP else (err.strerror or type(err).__name__)
    return SourceError(SOURCE_UNREADABLE, f"{shown}: cannot read: {why}")


def _glob_prefix(path: Path) -> Path:
    """The part of a path before its first glob component (the folder a glob searches)."""
    parts = []
    for part in path.parts:
        if glob.has_magic(part):
            break
        parts.append(part)
    return Path(*parts) if parts else Path(".")


def _outside(path: str, why: str) -> SidecarError:
    return SidecarError(
        ErrorKind.PERMISSION_DENIED,
        "PATH_OUTSIDE_ROOTS",
        f"knowledge path {path!r} refused: {why}",
        metadata={"path": path},
    )


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
