"""Hybrid retrieval index: dense HNSW (usearch) plus BM25 (lexical.py), fused as fusion.py says.

An index changes in place and a change costs what it changes: `add` and `remove` touch only the chunks named,
on both sides (usearch adds and removes graph nodes; the BM25 side keeps collection statistics and postings
incrementally), so a search right after a write sees it at the price of a steady search. Each chunk sits in
a slot (its usearch key and its row of float32 vectors: knowledge/slots.py); a removed chunk leaves a dead slot
behind. Once dead slots outnumber live ones, a compaction rebuilds the index from its live chunks on a background
thread (knowledge/compaction.py), replays the changes made meanwhile and swaps the result in, so memory stays
proportional to what is live and the graph does not decay. Every method is thread-safe: searches (and a snapshot's
copy) share the index's read-write lock and run at once; a change holds it alone for the milliseconds it takes,
never while a compaction builds.

Persistence is one folder, replaced atomically (knowledge/index_files.py); its manifest names the source it
indexes, so a start-up `sweep` can drop indexes a newer one superseded. Once a folder holds an index of MAPPED_FROM
slots or more, the index reads from it what only hits need: each hit's record (text and metadata, by byte offset,
through a small cache of recent hits), the float32 rows it rescores with and its graph until a change (both
memory-mapped), and the saved chunks' fields its filters select by (knowledge/field_columns.py); it holds the BM25
side and each slot's key and id. A folder of the previous format (immutable, bm25s files) is read by rebuilding both
sides from its vectors and chunk texts: an upgrade re-embeds nothing.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# onnxruntime is loaded before usearch's compiled extension, always: in the other order `import onnxruntime` kills
# the process (SIGSEGV in its pybind module; usearch 2.26.6 with onnxruntime 1.31.1 on linux x86_64), so a tool or
# bench that searched an index before loading a model crashed. Every process that searches also embeds, so this
# loads nothing the process would not load anyway.
import onnxruntime  # noqa: F401, I001 - imported for its load order, see above
from usearch.index import BatchMatches, Index

from ragsidecar import metrics, tracing
from ragsidecar.knowledge import filters, leftovers
from ragsidecar.knowledge.compaction import compactor
from ragsidecar.knowledge.fusion import FusionSettings, alternate, fed_back_scores, fuse_scores, union
from ragsidecar.knowledge.index_files import (
    BM25,
    CHUNKS,
    DENSE,
    FIELDS,
    FORMAT_VERSION,
    KEYS,
    OFFSETS,
    REBUILT_FORMATS,
    VECTORS,
    IndexCorrupt,
    files_of,
    fsync_dir,
    fsync_file,
    readable_folder,
    remove_strays,
    swap_in,
    verified_manifest,
    write_manifest,
)
from ragsidecar.knowledge.lexical import NO_STEMMING, Lexical
from ragsidecar.knowledge.slots import IndexedChunk, Rows, Slots, Taken, chunk_from, read_records

log = logging.getLogger(__name__)

DTYPES = ("f16", "i8")

# Defaults measured by bench/index.py (100k clustered 384-d vectors, recall@10 vs exact search >= 0.98 for
# both dtypes). `expansion_search` is a floor: usearch widens it to the number of results asked for, and
# hybrid search asks for GRAPH_OVERSAMPLE x `candidates` ([retrieval] fusion_candidates, 100) results, so real
# queries search wider than the bench's k=10.
DEFAULT_CONNECTIVITY = 16
DEFAULT_EXPANSION_ADD = 128
DEFAULT_EXPANSION_SEARCH = 64
# A filtered search scores its selection exactly when that costs no more than the graph's ask would: a neighbour the
# graph is asked for costs about what scoring this many selected chunks exactly does (bench/filters.py, 100k chunks,
# 100 candidates: about 10 us against 0.45 us, so the exact scan, exact in what it finds, up to about 17% of them).
EXACT_ROWS_PER_NEIGHBOUR = 24
# The graph is asked for this many times the neighbours a search wants, the best of them kept after exact scoring:
# asked for just the 100 candidates a hybrid search fuses (its search list then 100 wide), the graph returned 96% of
# the true nearest 100 on LISA's 6,000 abstracts, 98% on NPL's 11,000 (bge-small, f16), and the neighbours it
# missed cost LISA 0.008 nDCG@10; asked for twice as many, 99.4% and 99.6%, for about 0.3 ms (bench/beir.py).
GRAPH_OVERSAMPLE = 2
# Selected vectors are gathered and scored this many at a time: a block stays in the CPU's cache (gathering 10,000
# rows at once, a fresh 15 MB array, cost twice as much).
_SCORED_BLOCK = 512

# The graph's first ask for a filtered search: the candidates over the selection's share, times this margin (the ask
# doubles while too few pass; a wider first ask costs every search, bench/filters.py).
_OVERFETCH_MARGIN = 1.3
# A saved index of at least this many slots reads its chunks' texts and vectors from the snapshot's files
# (`Slots.map`); a smaller one keeps them in memory (each mapped index holds two open files).
MAPPED_FROM = 1024

# Estimated resident bytes per slot beside its vectors and text: its key and id (strings, a dict entry, a list's).
_SLOT_BYTES = 300
# A compaction is due once dead slots pass both the live chunks and this floor (small indexes never wait on one).
_COMPACT_AFTER_DEAD = 1024
# Workers of one graph call that searches several waiting queries (_GraphSearches): the two cores a sidecar is
# sized for; a call of one query uses one.
BATCH_THREADS = 2
# Searches that run at once in the process, of whatever index; the others wait their turn. Half a search holds the
# GIL, and threads wrestling for it cost more than a second core gives: 8 threads searching a 100k index at once
# reached 0.92 to 0.97 times the searches per second of one thread, passed 2 at a time 1.29 to 1.30, 3 at a time
# 1.28 to 1.36, 4 at a time 1.16 (2 idle cores, numpy's sine reaching 1.86 to 2.16). Two: the cores a sidecar is
# sized for.
SEARCHES_AT_ONCE = 2
_SEARCHING = threading.BoundedSemaphore(SEARCHES_AT_ONCE)


@contextmanager
def _turn() -> Iterator[None]:
    """One of the SEARCHES_AT_ONCE turns, the wait counted (ragsidecar_index_searches_waiting)."""
    metrics.INDEX_SEARCHES_WAITING.inc()
    try:
        _SEARCHING.acquire()
    finally:
        metrics.INDEX_SEARCHES_WAITING.dec()
    try:
        yield
    finally:
        _SEARCHING.release()


# RRF at k 60: the fusion of a search that names none, and of one list alone (its own ranks).
_DEFAULT_FUSION = FusionSettings()
# Keys and their scores, best first.
Scored = tuple[np.ndarray, np.ndarray]
_NO_KEYS = np.zeros(0, dtype=np.intp)


@dataclass(frozen=True)
class Hit:
    chunk: IndexedChunk
    dense: float
    bm25: float | None
    fused: float


def make_hnsw(
    dimensions: int,
    dtype: str = "f16",
    connectivity: int = DEFAULT_CONNECTIVITY,
    expansion_add: int = DEFAULT_EXPANSION_ADD,
    expansion_search: int = DEFAULT_EXPANSION_SEARCH,
) -> Index:
    """The usearch index HybridIndex uses; public so the benchmark measures exactly this configuration."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return Index(
        ndim=dimensions,
        metric="cos",
        dtype=dtype,
        connectivity=connectivity,
        expansion_add=expansion_add,
        expansion_search=expansion_search,
    )


@dataclass(frozen=True)
class _Settings:
    dimensions: int
    threads: int
    dtype: str
    connectivity: int
    expansion_add: int
    expansion_search: int
    lexical_language: str

    def hnsw(self) -> Index:
        return make_hnsw(self.dimensions, self.dtype, self.connectivity, self.expansion_add, self.expansion_search)


@dataclass(eq=False)
class _GraphAsk:
    """One search's ask of the graph, answered by whichever thread leads the call that takes it."""

    query: np.ndarray
    count: int
    answered: threading.Event = field(default_factory=threading.Event)
    keys: np.ndarray | None = None
    error: BaseException | None = None
    lead: bool = False  # woken to lead the next call, not answered


class _GraphSearches:
    """The graph searches of one index, those waiting gathered into one usearch call.

    usearch runs one search call of an index at a time (2.26.6: a call lets go of the GIL, then holds a mutex for
    its whole length while its workers use search contexts numbered from 0), so searches of one query each walk the
    graph one after another on one core however many threads search. Gathered, the queries waiting share one call,
    which searches them on up to BATCH_THREADS workers. A search that finds a call running waits for it; the leader
    then wakes the oldest waiting search to lead the next call, which takes every waiting ask of that size. Only
    asks of one size share a call: usearch widens its search to the neighbours asked for, so a query's neighbours
    depend on the size it asks, never on the other queries of its call (each is searched alone, in its own
    context). At most one ask per searching thread waits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[_GraphAsk] = []
        self._running = False

    def search(self, hnsw: Index, query: np.ndarray, count: int, threads: int) -> np.ndarray:
        """The graph's nearest `count` keys to `query` (nearest first; fewer when the graph holds fewer)."""
        ask = _GraphAsk(query, count)
        with self._lock:
            self._waiting.append(ask)
            ask.lead = not self._running
            self._running = True
        if not ask.lead:
            ask.answered.wait()
        if ask.lead:
            self._lead(hnsw, threads)
        if ask.error is not None:
            raise ask.error
        assert ask.keys is not None  # answered without an error
        return ask.keys

    def _lead(self, hnsw: Index, threads: int) -> None:
        """Runs one call for the oldest waiting ask and those of its size, then hands the lead on."""
        with self._lock:
            count = self._waiting[0].count
            batch = [ask for ask in self._waiting if ask.count == count]
            self._waiting = [ask for ask in self._waiting if ask.count != count]
        try:
            if len(batch) == 1:
                batch[0].keys = np.asarray(hnsw.search(batch[0].query, count, threads=1).keys, dtype=np.int64)
            else:
                queries = np.stack([ask.query for ask in batch])
                matches = hnsw.search(queries, count, threads=min(len(batch), max(threads, BATCH_THREADS)))
                assert isinstance(matches, BatchMatches)  # several queries: one list each
                for ask, keys, found in zip(batch, matches.keys, matches.counts, strict=True):
                    ask.keys = np.asarray(keys[:found], dtype=np.int64)
        except BaseException as error:
            for ask in batch:
                ask.error = error
        with self._lock:
            if self._waiting:
                self._waiting[0].lead = True
                self._waiting[0].answered.set()
            else:
                self._running = False
        for ask in batch:
            ask.lead = False
            ask.answered.set()


class _ReadWriteLock:
    """Searches (and snapshots) share it; a change holds it alone. A waiting change stops new readers from
    entering, so a stream of searches never starves a write."""

    def __init__(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._condition:
            while self._writing or self._writers_waiting:
                self._condition.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._condition:
                self._readers -= 1
                if not self._readers:
                    self._condition.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._condition:
            self._writers_waiting += 1
            while self._writing or self._readers:
                self._condition.wait()
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._condition:
                self._writing = False
                self._condition.notify_all()


class HybridIndex:
    def __init__(
        self,
        dimensions: int,
        threads: int = 1,
        dtype: str = "f16",
        connectivity: int = DEFAULT_CONNECTIVITY,
        expansion_add: int = DEFAULT_EXPANSION_ADD,
        expansion_search: int = DEFAULT_EXPANSION_SEARCH,
        lexical_language: str = NO_STEMMING,
    ) -> None:
        if dimensions <= 0 or threads <= 0:
            raise ValueError("dimensions and threads must be positive")  # usearch reads threads=0 as all cores
        self._settings = _Settings(
            dimensions, threads, dtype, connectivity, expansion_add, expansion_search, lexical_language
        )
        self._lock = _ReadWriteLock()
        self._graph_searches = _GraphSearches()
        self._slots = Slots(dimensions)
        self._hnsw = self._settings.hnsw()
        self._graph_mapped = False  # opened from a snapshot: the graph is its file's pages, read-only
        self._lexical = Lexical(lexical_language)
        # How far this index is caught up with the store it caches (the store's change sequence of the last change
        # applied; 0 for indexes of files). Read under the lock with the content, so a snapshot is stamped with
        # exactly the changes it holds.
        self._position = 0
        # While a compaction builds: the changes made meanwhile, replayed onto its result before the swap.
        self._changes_during_compaction: list[Callable[[HybridIndex], object]] | None = None

    @classmethod
    def build(
        cls,
        chunks: list[IndexedChunk],
        vectors: np.ndarray,
        threads: int = 1,
        dtype: str = "f16",
        *,
        connectivity: int = DEFAULT_CONNECTIVITY,
        expansion_add: int = DEFAULT_EXPANSION_ADD,
        expansion_search: int = DEFAULT_EXPANSION_SEARCH,
        lexical_language: str = NO_STEMMING,
        keys: list[str] | None = None,
        position: int = 0,
    ) -> HybridIndex:
        """`vectors[i]` is the unit-length float32 embedding of `chunks[i]`; `lexical_language` names the
        analysis of the BM25 side (lexical.LANGUAGES), kept by the index and applied to its queries; `position`
        the store's change the chunks are as of."""
        index = cls(
            _dimensions_of(vectors, len(chunks)),
            threads,
            dtype,
            connectivity,
            expansion_add,
            expansion_search,
            lexical_language,
        )
        index.update([], chunks, vectors, keys, position=position)
        index.maintain()  # a new index starts with its BM25 segments merged, not merging while it serves
        return index

    @classmethod
    def empty_like(cls, other: HybridIndex) -> HybridIndex:
        settings = other._settings
        return cls(
            settings.dimensions,
            settings.threads,
            settings.dtype,
            settings.connectivity,
            settings.expansion_add,
            settings.expansion_search,
            settings.lexical_language,
        )

    # ---- changes ---------------------------------------------------------------------------------------

    def add(self, chunks: list[IndexedChunk], vectors: np.ndarray, keys: list[str] | None = None) -> None:
        """Adds chunks under their `keys` (default: their ids); a key already present is replaced."""
        self.update([], chunks, vectors, keys)

    def update(
        self,
        removed: list[str],
        chunks: list[IndexedChunk],
        vectors: np.ndarray,
        keys: list[str] | None = None,
        *,
        position: int | None = None,
    ) -> None:
        """Removes the chunks under `removed` and adds `chunks` in one step: no search sees one without the
        other (a document or file replaced). `position`: the store's change this brings the index up to."""
        keys = [c.id for c in chunks] if keys is None else keys
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape != (len(chunks), self.dimensions) or len(keys) != len(chunks):
            raise ValueError(
                f"vectors must be [{len(chunks)}, {self.dimensions}] with one key per chunk, "
                f"got {vectors.shape} and {len(keys)} keys"
            )
        if len(set(keys)) != len(keys):
            raise ValueError("chunk keys must be unique")
        with self._lock.writing():
            self._remove_locked([*removed, *keys])
            if chunks:
                slots = self._slots.append(keys, chunks, vectors)
                self._graph_in_memory()
                self._hnsw.add(slots.astype(np.uint64), vectors, threads=self._settings.threads)
                self._lexical.add(slots.tolist(), [c.text for c in chunks])
            if position is not None:
                self._position = position
            self._record(lambda index: index.update(removed, chunks, vectors, keys))
            upkeep_due = self.compaction_due() or self._lexical.needs_merge()
        if upkeep_due:
            compactor.request(self)

    def remove(self, keys: Iterable[str]) -> int:
        """Removes the chunks under `keys` (absent ones are ignored); returns how many were removed."""
        keys = list(keys)
        with self._lock.writing():
            removed = self._remove_locked(keys)
            self._record(lambda index: index.remove(keys))
        if removed and self.compaction_due():
            compactor.request(self)
        return removed

    def _remove_locked(self, keys: list[str]) -> int:
        slots = self._slots.release(keys)
        if slots:
            self._graph_in_memory()
        for slot in slots:
            self._hnsw.remove(slot)
        self._lexical.remove(slots)
        return len(slots)

    def _graph_in_memory(self) -> None:
        """A mapped graph copied into memory before its first change (usearch changes no mapped graph)."""
        if self._graph_mapped:
            self._hnsw, self._graph_mapped = self._hnsw.copy(), False

    def _record(self, change: Callable[[HybridIndex], object]) -> None:
        if self._changes_during_compaction is not None:
            self._changes_during_compaction.append(change)

    # ---- compaction ------------------------------------------------------------------------------------

    def compaction_due(self) -> bool:
        dead = self._slots.used - len(self._slots.of_key)
        return dead > max(len(self._slots.of_key), _COMPACT_AFTER_DEAD) and self._changes_during_compaction is None

    def maintain(self) -> None:
        """Background upkeep (the compactor's): a compaction when due, else the BM25 side's merges too large to
        run inside a write, each run without the lock and installed under it."""
        if self.compact():
            return
        while True:
            with self._lock.writing():
                lexical = self._lexical
                merge = lexical.start_merge()
            if merge is None:
                return
            try:
                merge.run()
            except BaseException:
                with self._lock.writing():
                    lexical.cancel_merge(merge)  # its segments may be merged again later
                raise
            with self._lock.writing():
                lexical.finish_merge(merge)

    def compact(self) -> bool:
        """Rebuilds the index from its live chunks without holding the lock while it builds; changes made
        meanwhile are replayed onto the result, which then takes this index's place. False when not due."""
        with self._lock.writing():
            if not self.compaction_due():
                return False
            read_live = self._slots.live()
            self._changes_during_compaction = []
        try:
            keys, chunks, vectors = read_live()
            fresh = HybridIndex.empty_like(self)
            fresh.add(chunks, vectors, keys)
            fresh.maintain()
        except BaseException:
            with self._lock.writing():
                self._changes_during_compaction = None
            raise
        with self._lock.writing():
            for change in self._changes_during_compaction:
                change(fresh)
            self._changes_during_compaction = None
            self._slots, self._hnsw, self._lexical = fresh._slots, fresh._hnsw, fresh._lexical
            self._graph_mapped = False
        metrics.INDEX_COMPACTIONS.inc()
        return True

    # ---- reads -----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slots.of_key)

    @property
    def dimensions(self) -> int:
        return self._settings.dimensions

    @property
    def dtype(self) -> str:
        return self._settings.dtype

    @property
    def position(self) -> int:
        """The store's change sequence this index holds every change up to (its snapshot's stamp)."""
        return self._position

    @property
    def lexical_language(self) -> str:
        return self._settings.lexical_language

    def vectors(self) -> np.ndarray:
        """The live chunks' vectors, in the order of `chunks()`."""
        with self._lock.reading():
            read_live = self._slots.live()
        return read_live()[2]

    def chunks(self) -> list[IndexedChunk]:
        with self._lock.reading():
            read_live = self._slots.live()
        return read_live()[1]

    def keys(self) -> set[str]:
        with self._lock.reading():
            return set(self._slots.of_key)

    def nbytes(self) -> int:
        """Estimated resident bytes: the graph (its serialized size) unless it is mapped from a snapshot, the
        float32 rows and chunk texts held in memory (not those a snapshot's files hold), the BM25 side, and per
        slot its key and id. (Mapped files are the kernel's page cache: shared, clean, reclaimed under pressure.)"""
        with self._lock.reading():
            slots = self._slots
            held = _SLOT_BYTES * slots.used + slots.vectors.nbytes() + slots.text_chars
            graph = 0 if self._graph_mapped else self._hnsw.serialized_length
            return held + graph + self._lexical.nbytes()

    def search(
        self,
        query_vector: np.ndarray,
        query_text: str,
        k: int,
        candidates: int = 50,
        use_dense: bool = True,
        use_lexical: bool = True,
        fusion: FusionSettings = _DEFAULT_FUSION,
        keep: filters.Filter | None = None,
        hide: filters.Filter | None = None,
    ) -> list[Hit]:
        """Best `k` chunks by `fusion` of the dense and BM25 top-`candidates` lists (ties: higher cosine first).
        `use_dense` / `use_lexical` pick the lists searched (dense-only or lexical-only retrieval: that list's
        own order, whatever the fusion's weights); every hit still gets its exact cosine. `keep`: only chunks
        whose fields (`fields_of`) the filter keeps are searched, as if the index held nothing else; `hide`: nor
        those it keeps (expired documents: its cost is what it selects). At most SEARCHES_AT_ONCE searches run at
        once in the process; the others wait their turn before taking any lock."""
        with _turn():
            return self._search(query_vector, query_text, k, candidates, use_dense, use_lexical, fusion, keep, hide)

    def _search(
        self,
        query_vector: np.ndarray,
        query_text: str,
        k: int,
        candidates: int,
        use_dense: bool,
        use_lexical: bool,
        fusion: FusionSettings,
        keep: filters.Filter | None,
        hide: filters.Filter | None,
    ) -> list[Hit]:
        with self._lock.reading():
            slots = self._slots
            allowed = slots.allowed(keep, hide)
            live = len(slots.of_key) if allowed is None else len(allowed)
            if k <= 0 or live == 0:
                return []
            query = self._unit_query(query_vector)
            # Both lists are `candidates` deep whatever k is, so the fused head, and every hit in it, is the same
            # for every k; when k asks for more than the head holds, the deeper lists follow it (`_beyond`).
            depth = min(candidates, live)
            dense_keys, cosines = _NO_KEYS, np.zeros(0, dtype=np.float32)
            lexical_keys, bm25 = _NO_KEYS, np.zeros(0)
            if use_dense:
                with tracing.span("dense search", chunks=live, candidates=depth) as span:
                    dense_keys, cosines = self._dense_top(query, depth, allowed)
                    span.set(hits=len(dense_keys))
            if use_lexical:
                with tracing.span("lexical search", chunks=live, candidates=depth) as span:
                    lexical_keys, bm25 = self._lexical.top_arrays(query_text or "", depth, allowed)
                    span.set(hits=len(lexical_keys))
            # The keys the fusion gives a score: the dense list's, then the lexical list's others.
            found, lexical_at = union(dense_keys, lexical_keys)
            deeper: tuple[Scored, Scored] | None = None
            if len(found) < k and depth < live:
                nothing: Scored = (_NO_KEYS, np.zeros(0))
                deeper = (
                    self._dense_top(query, min(k, live), allowed) if use_dense else nothing,
                    self._lexical.top_arrays(query_text or "", min(k, live), allowed) if use_lexical else nothing,
                )
                taken = slots.taken(set(found.tolist()).union(deeper[0][0].tolist(), deeper[1][0].tolist()))
            else:
                taken = slots.taken(found.tolist())
        # Fusion, feedback and the hits read only what was taken: changes do not wait for them. Over arrays, in a
        # few numpy calls (which let go of the GIL: a search beside others holds it less).
        with tracing.span("fusion", dense_hits=len(dense_keys), lexical_hits=len(lexical_keys)) as span:
            hybrid = use_dense and use_lexical
            fused = fuse_scores(
                cosines.astype(np.float64), bm25, lexical_at, len(found), fusion if hybrid else _DEFAULT_FUSION
            )
            if hybrid:  # only the candidates are fed back (fusion_candidates per list): the head stays the same
                fused = fed_back_scores(
                    fused,
                    fusion,
                    lambda i: taken.id_of(int(found[i])),
                    lambda best: _similarity_to_sum(taken, found[best], found),
                )
            span.set(hits=min(k, len(fused)))
        hits = _head(taken, query, found, fused, cosines, bm25, lexical_at, k)
        if deeper is not None:
            head = dict(zip(found.tolist(), fused.tolist(), strict=True))
            hits += _beyond(head, query, *deeper, taken)[: k - len(hits)]
        return hits

    def _unit_query(self, query_vector: np.ndarray) -> np.ndarray:
        query = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        if query.shape[0] != self.dimensions:
            raise ValueError(f"query vector has {query.shape[0]} dimensions, index has {self.dimensions}")
        norm = float(np.linalg.norm(query))
        # Normalising makes `dense` a true cosine even if a caller passes an unnormalised embedding.
        return query / norm if norm > 0 else query

    def _dense_top(self, query: np.ndarray, count: int, allowed: np.ndarray | None = None) -> Scored:
        """HNSW candidates re-scored with exact float32 cosines (the graph's f16/i8 distances are approximate), the
        best `count` of GRAPH_OVERSAMPLE times as many the graph is asked for, as keys and cosines best first;
        within `allowed` slots when given: all of them scored exactly when that costs no more than the graph's
        ask for them (EXACT_ROWS_PER_NEIGHBOUR), else the graph's."""
        if allowed is None:
            keys = self._graph_top(query, min(count * GRAPH_OVERSAMPLE, len(self._slots.of_key)))
            exact = self._slots.vectors[keys] @ query
        else:
            ask = int(count * len(self._slots.of_key) / len(allowed) * _OVERFETCH_MARGIN)
            if len(allowed) <= EXACT_ROWS_PER_NEIGHBOUR * max(ask, self._settings.expansion_search):
                keys = allowed
            else:
                keys = self._graph_top_within(query, count, allowed, ask)
            exact = _scores(self._slots.vectors, keys, query)
        if len(keys) > count:
            best = np.argpartition(-exact, count - 1)[:count]
            keys, exact = keys[best], exact[best]
        order = np.lexsort((keys, -exact))
        return keys[order].astype(np.intp), exact[order]

    def _graph_top(self, query: np.ndarray, count: int) -> np.ndarray:
        return self._graph_searches.search(self._hnsw, query, count, self._settings.threads)

    def _graph_top_within(self, query: np.ndarray, count: int, allowed: np.ndarray, ask: int) -> np.ndarray:
        """The graph's nearest `count` among `allowed`: it is asked for `ask` neighbours (the share that should
        hold `count` of them, with a margin), and twice as many each time too few pass; once the ask would reach
        the whole graph, every selected chunk instead (the caller scores them exactly)."""
        total = len(self._slots.of_key)
        member = np.zeros(self._slots.used, dtype=bool)
        member[allowed] = True
        while ask < total:
            keys = self._graph_top(query, ask)
            passing = keys[member[keys]]
            if len(passing) >= count:
                return passing
            ask *= 2
        return allowed  # the graph would be walked whole: every selected chunk is scored instead

    # ---- persistence -------------------------------------------------------------------------------------

    def save(self, folder: Path, source: str = "", stamp: dict[str, str] | None = None) -> None:
        """Replace `folder` atomically: readers and crashes see the old complete index or the new one.
        `source` names what the index indexes (one name per source, whatever its content): `sweep` keeps
        only the newest index of each. Slots are written as they are, dead ones included (the next
        compaction drops them), so a save costs the writing of the files, never a rebuild. `stamp` is written
        in the manifest with the index's position; `load(expect=...)` refuses a folder of another stamp.

        Saves to the same folder must not run concurrently (callers serialise them per folder)."""
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-{leftovers.owner_tag()}", dir=folder.parent))
        try:
            slots, offsets, live, position = self._write_files(temp)
            saved = len(offsets) - 1  # the slots written (more may have been added since)
            header = {**self._manifest_header(live), "slots": saved, "source": source, "position": position}
            # Last: its presence marks the folder complete.
            write_manifest(temp, {**header, "stamp": stamp or {}})
            fsync_dir(temp)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        swap_in(temp, folder)
        remove_strays(folder)
        if saved >= MAPPED_FROM:
            self._map(folder, slots, offsets)

    def _write_files(self, temp: Path) -> tuple[Slots, np.ndarray, int, int]:
        """Writes every slot (a dead one as a null line); returns the slots written (as of then: `used` may grow
        after), their line offsets, the live chunks and the position. Changes wait for the copy of the graph and
        the BM25 side only, not for the other files nor the fsync."""
        with self._lock.reading():
            slots = self._slots
            write_slots = slots.saved()
            graph = self._hnsw.save()  # into memory: the file is written after the lock is let go
            (temp / BM25).mkdir()
            self._lexical.save(temp / BM25)
            live, position = len(slots.of_key), self._position
        (temp / DENSE).write_bytes(graph or b"")
        (temp / KEYS).write_text(json.dumps(write_slots(temp), ensure_ascii=False), encoding="utf-8")
        offsets = np.load(temp / OFFSETS, allow_pickle=False)
        for path in files_of(temp):
            fsync_file(path)
        for sub in (p for p in temp.rglob("*") if p.is_dir()):
            fsync_dir(sub)
        return slots, offsets, live, position

    def _map(self, folder: Path, slots: Slots, offsets: np.ndarray) -> None:
        """Reads the saved slots' chunks and vectors from `folder`'s files from now on, unless a compaction
        replaced them meanwhile (its slots are numbered afresh: the next save maps those)."""
        with self._lock.writing():
            if self._slots is slots:
                slots.map(folder, len(offsets) - 1, offsets)

    def _manifest_header(self, count: int) -> dict[str, Any]:
        s = self._settings
        return {
            "format": FORMAT_VERSION,
            "count": count,
            "dimensions": s.dimensions,
            "dtype": s.dtype,
            "lexical_language": s.lexical_language,
            "connectivity": s.connectivity,
            "expansion_add": s.expansion_add,
            "expansion_search": s.expansion_search,
        }

    @classmethod
    def load(cls, folder: Path, threads: int = 1, expect: dict[str, str] | None = None) -> HybridIndex:
        """Load a saved index; IndexCorrupt when it is missing, incomplete or altered (then rebuild), or when its
        stamp lacks an item of `expect` (an index of something else: stale)."""
        folder = readable_folder(Path(folder))
        try:
            manifest = verified_manifest(folder)
            stamp = manifest.get("stamp") or {}
            if any(stamp.get(name) != value for name, value in (expect or {}).items()):
                raise IndexCorrupt(f"{folder}: stamped {stamp}, expected {expect}")
            index = cls._from_folder(folder, manifest, threads)
            index._position = int(manifest.get("position", 0))
            return index
        except IndexCorrupt:
            raise
        except Exception as error:  # usearch, numpy and the BM25 files each fail differently when damaged
            raise IndexCorrupt(f"{folder}: {type(error).__name__}: {error}") from error

    @classmethod
    def _from_folder(cls, folder: Path, manifest: dict[str, Any], threads: int) -> HybridIndex:
        count, dimensions = int(manifest["count"]), int(manifest["dimensions"])
        slots = int(manifest.get("slots", count))
        # An index saved before languages were configurable was analysed without stemming.
        index = cls(
            dimensions,
            threads,
            manifest["dtype"],
            int(manifest["connectivity"]),
            int(manifest["expansion_add"]),
            int(manifest["expansion_search"]),
            manifest.get("lexical_language", NO_STEMMING),
        )
        mapped = slots >= MAPPED_FROM and KEYS in manifest["files"]
        if mapped:
            index._restore_mapped(folder, slots, count, FIELDS in manifest["files"])
        elif not index._restore(folder, manifest, slots, count):
            return index
        if mapped:  # the graph is mapped too, until a change copies it into memory
            index._hnsw.view(str(folder / DENSE))
            index._graph_mapped = True
        else:
            index._hnsw.load(str(folder / DENSE))
        index._lexical = Lexical.load(folder / BM25, index.lexical_language)
        if len(index._hnsw) != count or len(index._lexical) != count:
            raise IndexCorrupt(f"{len(index._hnsw)} vectors and {len(index._lexical)} BM25 texts, expected {count}")
        if str(index._hnsw.dtype).rsplit(".", 1)[-1].lower() != index.dtype:
            raise IndexCorrupt(f"HNSW dtype {index._hnsw.dtype} differs from manifest {index.dtype}")
        return index

    def _restore_mapped(self, folder: Path, slots: int, count: int, with_fields: bool) -> None:
        """The slots of a large saved index, their chunks and vectors left in its files (read as hits need them),
        and their fields in its field index when it saved one (`with_fields`)."""
        offsets = np.load(folder / OFFSETS, allow_pickle=False)
        listing = json.loads((folder / KEYS).read_text(encoding="utf-8"))
        keys, ids = listing["keys"], listing["ids"]
        live = sum(key is not None for key in keys)
        if (
            offsets.dtype != np.int64
            or offsets.shape != (slots + 1,)
            or int(offsets[-1]) != (folder / CHUNKS).stat().st_size
            or len(keys) != len(ids) != slots
            or live != count
        ):
            raise IndexCorrupt(
                f"{len(keys)} slots ({live} live) and {offsets.dtype} {offsets.shape} offsets, expected {slots} "
                f"({count} live)"
            )
        self._slots.restore_mapped(folder, listing, offsets, with_fields)

    def _restore(self, folder: Path, manifest: dict[str, Any], slots: int, count: int) -> bool:
        """The slots of a saved index, held in memory (a small one, or one saved before files were mapped); False
        when the index was rebuilt from them (a format read by rebuilding: graph and BM25 side included)."""
        dimensions = self.dimensions
        vectors = np.load(folder / VECTORS, allow_pickle=False)
        records = read_records(folder / CHUNKS)
        live = [(slot, r) for slot, r in enumerate(records) if r is not None]
        if (
            vectors.shape != (slots, dimensions)
            or vectors.dtype != np.float32
            or len(records) != slots
            or len(live) != count
        ):
            raise IndexCorrupt(
                f"{len(records)} slots ({len(live)} live) and vectors {vectors.dtype} {vectors.shape}, "
                f"expected {slots} ({count} live) of {dimensions} dimensions"
            )
        if manifest["format"] in REBUILT_FORMATS:
            self.add([chunk_from(r) for _, r in live], vectors, [r.get("key", r["id"]) for _, r in live])
            return False
        self._slots.restore(records, vectors)
        return True


def _dimensions_of(vectors: np.ndarray, count: int) -> int:
    if vectors.ndim != 2 or vectors.shape[0] != count:
        raise ValueError(f"vectors must be [{count}, d], got {vectors.shape}")
    return int(vectors.shape[1])


def _scores(vectors: Rows, slots: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The dot products of `query` with the vectors of `slots`, gathered a cache-sized block at a time. One BLAS
    product over a whole selection cost 28 ms for 2,000 rows on a busy 2-core host; over blocks of _SCORED_BLOCK
    rows it took 2.1 ms for 10,000, einsum over the same blocks 3.6 ms (bench/filters.py's machine, loaded)."""
    scores = np.empty(len(slots), dtype=np.float32)
    for start in range(0, len(slots), _SCORED_BLOCK):
        block = slice(start, start + _SCORED_BLOCK)
        np.matmul(vectors[slots[block]], query, out=scores[block])
    return scores


def _similarity_to_sum(taken: Taken, best: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Each of `keys`' dot product with the sum of `best`'s vectors: pseudo-relevance feedback's likeness
    (fusion.fed_back_scores; the sum's norm does not matter, the similarities are min-max scaled)."""
    centroid = taken.vectors[best].sum(axis=0)
    return (taken.vectors[keys] @ centroid).astype(np.float64)


def _head(
    taken: Taken,
    query: np.ndarray,
    found: np.ndarray,
    fused: np.ndarray,
    cosines: np.ndarray,
    bm25: np.ndarray,
    lexical_at: np.ndarray,
    k: int,
) -> list[Hit]:
    """The best `k` of the candidates `found` by fused score (ties: higher cosine, then chunk id): the dense
    list's (the first len(cosines)) with their cosine, the others given theirs exactly; BM25 scores where the
    lexical list has one."""
    contenders = _contenders(fused, k)
    exact = np.zeros(len(contenders))
    dense = contenders < len(cosines)
    exact[dense] = cosines[contenders[dense]]
    if not dense.all():  # BM25-only candidates still get an exact cosine
        exact[~dense] = taken.vectors[found[contenders[~dense]]] @ query
    lexical = np.full(len(found), np.nan)
    lexical[lexical_at] = bm25
    rows = zip(contenders.tolist(), found[contenders].tolist(), fused[contenders].tolist(), exact.tolist(), strict=True)
    best = sorted(rows, key=lambda row: (-row[2], -row[3], taken.id_of(row[1])))[:k]
    scores = lexical.tolist()
    return [
        Hit(taken.hit_chunk(slot), cosine, None if math.isnan(scores[i]) else scores[i], score)
        for i, slot, score, cosine in best
    ]


def _beyond(
    head: dict[int, float],
    query: np.ndarray,
    dense: Scored,
    lexical: Scored,
    taken: Taken,
) -> list[Hit]:
    """The chunks past the fused head: both lists, deeper than the head's, taken alternately (a rank at a time).
    Alternating rather than fusing keeps the order of the first ones the same whatever their depth is. Scores
    step down from the head's lowest, a millionth of it at a time (never a tie: hits from several sources
    are merged by score)."""
    rest = [p for p in alternate(dense[0].tolist(), lexical[0].tolist()) if p not in head]
    cosines = dict(zip(dense[0].tolist(), dense[1].tolist(), strict=True))
    bm25 = dict(zip(lexical[0].tolist(), lexical[1].tolist(), strict=True))
    missing = [p for p in rest if p not in cosines]
    if missing:
        cosines.update(zip(missing, (taken.vectors[missing] @ query).tolist(), strict=True))
    floor = min(head.values(), default=0.0)
    step = abs(floor) * 1e-6 or 1e-6
    return [Hit(taken.hit_chunk(p), float(cosines[p]), bm25.get(p), floor - (i + 1) * step) for i, p in enumerate(rest)]


def _contenders(fused: np.ndarray, k: int) -> np.ndarray:
    """The candidates (positions) that can be among the `k` best fused scores: those at or above the k-th best.
    Only they are sorted by the full key (score, cosine, chunk id) and given a cosine they lack: a search fuses up
    to 200 candidates for a k of 10, and sorting them all cost a sixth of a search at 100k chunks."""
    if len(fused) <= k:
        return np.arange(len(fused))
    return np.flatnonzero(fused >= np.partition(fused, len(fused) - k)[len(fused) - k])
