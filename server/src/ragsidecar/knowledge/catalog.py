"""Knowledge sources, loaded and indexed: cached by content (never by caller) and persisted.

A source's identity is its name and location; its index key hashes what went into it (files with their
sizes and modification times, chunking settings, embedder). An unchanged source is served from memory,
or from its persisted index after a restart; a changed one is rebuilt, embedding only chunks whose text
is new. A source whose reload fails is served from its last good index and says so (stale fallback).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import glob
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ragsidecar import metrics
from ragsidecar.cache import ByteLRU
from ragsidecar.config import Config
from ragsidecar.errors import ErrorKind, SidecarError
from ragsidecar.inference.models import BiEncoder
from ragsidecar.inference.registry import ModelRegistry
from ragsidecar.knowledge.chunking import Chunk, chunk_units
from ragsidecar.knowledge.declarations import Entry, Scope, SourceType
from ragsidecar.knowledge.index import HybridIndex, IndexCorrupt, IndexedChunk
from ragsidecar.knowledge.memory import MemoryStore
from ragsidecar.knowledge.sources import SourceError, Unit, inline_units, list_files, read_units

log = logging.getLogger(__name__)

_EMBED_BATCH = 128
_PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True)
class Stale:
    reason: str
    built_at: dt.datetime


@dataclass(frozen=True)
class LoadedSource:
    name: str
    units: list[Unit]
    index: HybridIndex | None
    built_at: dt.datetime
    stale: Stale | None = None


class Catalog:
    def __init__(self, config: Config, registry: ModelRegistry) -> None:
        self._config = config
        self._registry = registry
        self._roots = config.knowledge_roots()
        self._index_dir = config.resolve(config.paths.data_dir) / "indexes"
        self.memory = MemoryStore(config.resolve(config.paths.data_dir) / "memory")
        self.bindings = MemoryStore(None)  # chat bindings' live corpora: server memory only
        self._loaded: dict[str, LoadedSource] = {}           # index key -> source
        self._last_good: dict[tuple[str, str], LoadedSource] = {}  # (name, location) -> source
        self._latest: dict[tuple[str, str], str] = {}  # (name, location) -> index key of its last good source
        self._vectors: ByteLRU[str, np.ndarray] = ByteLRU(256 * 1024 * 1024)
        self._parsed: ByteLRU[tuple[str, int, int], list[Unit]] = ByteLRU(64 * 1024 * 1024)
        self._building: dict[str, asyncio.Future[LoadedSource]] = {}
        # Called with (source name, chunks embedded, chunks to embed) as a build advances (the CLI's bar).
        self.on_progress: Callable[[str, int, int], None] | None = None

    # -- locations -------------------------------------------------------------------------------

    def resolve_path(self, path: str) -> Path:
        """The path, made absolute against the first root, that must resolve inside a root."""
        if not self._roots:
            raise _outside(path, "no knowledge roots are configured")
        candidate = Path(path).expanduser()
        if not candidate.is_absolute():
            candidate = self._roots[0] / candidate
        prefix = _glob_prefix(candidate)
        self._check_inside(prefix.resolve(), path)
        return candidate

    def _check_inside(self, resolved: Path, shown: str) -> None:
        if not any(resolved == root.resolve() or resolved.is_relative_to(root.resolve()) for root in self._roots):
            raise _outside(shown, "it resolves outside the configured knowledge roots")

    def files_of(self, entry: Entry) -> list[Path]:
        """The files a FILE or DIRECTORY entry reads; every one checked inside the roots after symlinks."""
        location = self.resolve_path(entry.path)
        if entry.type is SourceType.FILE and not location.is_file():
            raise FileNotFoundError(entry.path)
        files = [location] if entry.type is SourceType.FILE else list_files(location)
        for file in files:
            self._check_inside(file.resolve(), str(file))
        return files

    # -- units (DIRECT, SEQUENTIAL, counts) ---------------------------------------------------------

    async def units(self, entry: Entry, scope: Scope) -> list[Unit]:
        """Every unit of the source in source order (raises FileNotFoundError, SourceError)."""
        if entry.type is SourceType.INLINE:
            return inline_units(entry.inline_text)
        if entry.type is SourceType.MEMORY:
            return self.memory.units(scope, entry.name)
        if entry.type is SourceType.BINDING:
            return self.bindings.units(scope, entry.name)
        return await asyncio.to_thread(self._read_files, entry)

    def _read_files(self, entry: Entry) -> list[Unit]:
        """Units of every file; an unchanged file (same size and modification time) is not parsed again,
        since DIRECT and SEQUENTIAL sources are read on every dispatch."""
        units: list[Unit] = []
        for file in self.files_of(entry):
            stat = file.stat()
            key = (str(file), stat.st_size, stat.st_mtime_ns)
            parsed = self._parsed.get(key)
            if parsed is None:
                root = next(r for r in self._roots if file.resolve().is_relative_to(r.resolve()))
                parsed = read_units(file, root.resolve(), self._config.retrieval.max_file_bytes)
                self._parsed.put(key, parsed, sum(len(u.text) for u in parsed))
            units += parsed
        return units

    # -- indexes (SEARCH) ------------------------------------------------------------------------

    async def load(self, entry: Entry, scope: Scope) -> LoadedSource:
        """The source's index, built or reused; a failed reload falls back to the last good index."""
        identity = (entry.name, self._location(entry, scope))
        try:
            key = await asyncio.to_thread(self._key, entry, scope)
            source = self._loaded.get(key)
            if source is None:
                source = await self._build_once(key, entry, scope)
        except (SourceError, OSError) as err:
            last = self._last_good.get(identity)
            if last is None or isinstance(err, FileNotFoundError):
                raise
            log.warning("source %s failed to reload (%s); serving its last good index", entry.name, err)
            return LoadedSource(last.name, last.units, last.index, last.built_at, Stale(str(err), last.built_at))
        # An index superseded by a newer one of the same source leaves memory (a live corpus changes often).
        if self._latest.get(identity, key) != key:
            self._loaded.pop(self._latest[identity], None)
        self._latest[identity], self._last_good[identity] = key, source
        return source

    def forget(self, entry: Entry, scope: Scope) -> None:
        """Drops the source's index from memory; the next load rebuilds it (embeddings stay cached)."""
        identity = (entry.name, self._location(entry, scope))
        self._loaded.pop(self._latest.pop(identity, ""), None)
        self._last_good.pop(identity, None)

    async def _build_once(self, key: str, entry: Entry, scope: Scope) -> LoadedSource:
        """Concurrent loads of one source share a single build."""
        if key in self._building:
            return await asyncio.shield(self._building[key])
        future: asyncio.Future[LoadedSource] = asyncio.get_running_loop().create_future()
        self._building[key] = future
        try:
            source = await self._build(key, entry, scope)
            self._loaded[key] = source
            future.set_result(source)
            return source
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # retrieved here, so an unawaited failure is not logged as lost
            raise
        finally:
            del self._building[key]

    async def _build(self, key: str, entry: Entry, scope: Scope) -> LoadedSource:
        folder = self._index_dir / key
        units = await self.units(entry, scope)
        persisted = entry.type not in (SourceType.MEMORY, SourceType.BINDING)
        if persisted and folder.exists():
            try:
                index = await asyncio.to_thread(HybridIndex.load, folder, self._config.retrieval.index_threads)
                built = dt.datetime.fromtimestamp(folder.stat().st_mtime, dt.timezone.utc)
                metrics.INDEX_LOADS.labels("disk").inc()
                self._remember_vectors(index)
                return LoadedSource(entry.name, units, index, built)
            except IndexCorrupt as err:
                log.warning("index of %s at %s is corrupt (%s); rebuilding it", entry.name, folder, err)
        embedder = self._registry.embedder(self._config.retrieval.embedder)
        with embedder.in_use():
            chunks = await asyncio.to_thread(self._chunk, entry.name, units, embedder)
            vectors = await self._embed_chunks(entry.name, chunks, embedder)
        index = await asyncio.to_thread(self._index, chunks, vectors)
        metrics.INDEX_LOADS.labels("built").inc()
        if persisted:
            await asyncio.to_thread(index.save, folder)
        return LoadedSource(entry.name, units, index, dt.datetime.now(dt.timezone.utc))

    def _chunk(self, name: str, units: list[Unit], embedder: BiEncoder) -> list[Chunk]:
        retrieval = self._config.retrieval
        return chunk_units(name, units, embedder.encoder.tokenizer, retrieval.chunk_tokens,
                           retrieval.chunk_overlap_tokens)

    def index_folder(self, entry: Entry, scope: Scope) -> Path:
        """Where the index of that source, as it is now, is persisted."""
        return self._index_dir / self._key(entry, scope)

    def _index(self, chunks: list[Chunk], vectors: np.ndarray) -> HybridIndex:
        indexed = [IndexedChunk(c.id, c.text, _meta(c)) for c in chunks]
        retrieval = self._config.retrieval
        return HybridIndex.build(indexed, vectors, threads=retrieval.index_threads, dtype=retrieval.index_dtype)

    async def _embed_chunks(self, name: str, chunks: list[Chunk], embedder: BiEncoder) -> np.ndarray:
        """Vectors for the chunks; only texts not embedded before (by content hash) reach the model."""
        cache_key = embedder.fingerprint
        missing = [c for c in chunks if self._vectors.get(f"{cache_key}:{c.content_hash}") is None]
        started, last_report = time.monotonic(), time.monotonic()
        for start in range(0, len(missing), _EMBED_BATCH):
            batch = missing[start : start + _EMBED_BATCH]
            vectors, *_ = await embedder.embed([c.text for c in batch])
            metrics.EMBEDDED_CHUNKS.inc(len(batch))
            for chunk, vector in zip(batch, vectors):
                self._vectors.put(f"{cache_key}:{chunk.content_hash}", vector, vector.nbytes)
            done = start + len(batch)
            if self.on_progress:
                self.on_progress(name, done, len(missing))
            if time.monotonic() - last_report >= _PROGRESS_EVERY_S or done == len(missing):
                last_report = time.monotonic()
                rate = done / max(last_report - started, 1e-9)
                log.info("indexing %s: embedded %d/%d new chunks (%.1f chunks/s; %d reused)",
                         name, done, len(missing), rate, len(chunks) - len(missing))
        dimensions = embedder.dimensions
        return np.stack([self._vectors.get(f"{cache_key}:{c.content_hash}") for c in chunks]) if chunks \
            else np.zeros((0, dimensions), dtype=np.float32)

    def _remember_vectors(self, index: HybridIndex) -> None:
        """Seeds the embedding cache from an index read back from disk, so that after a restart a
        changed source re-embeds only its new chunks."""
        fingerprint = self._registry.embedder(self._config.retrieval.embedder).fingerprint
        for chunk, vector in zip(index.chunks(), index.vectors()):
            digest = chunk.meta.get("content_hash")
            if digest:
                self._vectors.put(f"{fingerprint}:{digest}", vector, vector.nbytes)

    async def query_vector(self, query: str) -> np.ndarray:
        embedder = self._registry.embedder(self._config.retrieval.embedder)
        with embedder.in_use():
            vectors, *_ = await embedder.embed([self._config.retrieval.query_prefix + query])
        return vectors[0]

    # -- keys ------------------------------------------------------------------------------------

    def _location(self, entry: Entry, scope: Scope) -> str:
        if entry.type is SourceType.MEMORY:
            return f"memory:{scope.tenant}\x00{scope.session}"
        if entry.type is SourceType.BINDING:
            return f"binding:{scope.tenant}\x00{scope.session}"
        if entry.type is SourceType.INLINE:
            return "inline:" + hashlib.sha256(entry.inline_text.encode()).hexdigest()
        return entry.path

    def _key(self, entry: Entry, scope: Scope) -> str:
        """Hash of everything the index depends on; equal keys mean an identical index."""
        retrieval = self._config.retrieval
        parts = [entry.name, str(entry.type), retrieval.embedder, str(retrieval.chunk_tokens),
                 str(retrieval.chunk_overlap_tokens), retrieval.index_dtype, self._location(entry, scope)]
        if entry.type in (SourceType.FILE, SourceType.DIRECTORY):
            for file in self.files_of(entry):
                stat = file.stat()
                parts.append(f"{file}:{stat.st_size}:{stat.st_mtime_ns}")
        elif entry.type is SourceType.MEMORY:
            parts.append(str(self.memory.version(scope, entry.name)))
        elif entry.type is SourceType.BINDING:
            parts.append(str(self.bindings.version(scope, entry.name)))
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def _meta(chunk: Chunk) -> dict:
    provenance = chunk.provenance
    return {"position": chunk.position, "content_hash": chunk.content_hash, "file": provenance.file, "document_id": provenance.document_id,
            "line_start": provenance.line_start, "line_end": provenance.line_end, "page": provenance.page,
            "char_start": provenance.char_start, "char_end": provenance.char_end}


def _glob_prefix(path: Path) -> Path:
    """The part of a path before its first glob component (the folder a glob searches)."""
    parts = []
    for part in path.parts:
        if glob.has_magic(part):
            break
        parts.append(part)
    return Path(*parts) if parts else Path(".")


def _outside(path: str, why: str) -> SidecarError:
    return SidecarError(ErrorKind.PERMISSION_DENIED, "PATH_OUTSIDE_ROOTS", f"knowledge path {path!r} refused: {why}",
                        metadata={"path": path})


def source_error(name: str, err: Exception) -> SidecarError:
    """A load failure as the API reports it: a missing file is not ready, anything else unreadable."""
    if isinstance(err, FileNotFoundError):
        return SidecarError(ErrorKind.FAILED_PRECONDITION, "KNOWLEDGE_NOT_READY",
                            f"knowledge source {name!r} has no file at {err}", metadata={"sources": name})
    if isinstance(err, SourceError) and err.reason == "LIMIT_EXCEEDED":
        return SidecarError(ErrorKind.FAILED_PRECONDITION, "LIMIT_EXCEEDED", f"knowledge source {name!r}: {err}",
                            metadata={"sources": name})
    return SidecarError(ErrorKind.FAILED_PRECONDITION, "SOURCE_UNREADABLE", f"knowledge source {name!r}: {err}",
                        metadata={"sources": name})

