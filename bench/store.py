"""MEMORY stores side by side: the embedded store and the PostgreSQL store, each driven through its DocumentStore
as the server drives it, at 1k, 10k and 100k chunks in one run. Per size and store: one-document upsert p50/p95
(acknowledged = durable), a search right after each write, steady search p50/p95, dense recall@10 against exact
search, and the process's resident memory. Prints a markdown table and writes bench/results/store.md.

Data. Real bge-small-en-v1.5 vectors for a base set, the rest derived from them (2 shared cores cannot embed
100k texts). The base set is SciFact read through bench/ir_collections.py (5183 abstracts as "title text",
one vector each, embedded with the product's model code by bench/beir.py's Embedder and cached under
bench/results/ with its key, so either benchmark reuses the other's vectors); without the full collections,
tests/data/scifact (390 abstracts). Chunk i of a partition of N is base document b = i mod B, copy
c = i div B: copy 0 is the document itself, id "<id>-0"; copy c >= 1 has id "<id>-c", text "<text> (variant c)"
and vector unit(v_b + NOISE * g / sqrt(384)), g a standard normal draw (seed 14): cosine about
1 / sqrt(1 + NOISE^2) = 0.96 to its original, closer than real neighbours (the output prints both), so each
abstract has a tight cluster of near-duplicates: a hard case for approximate search. One document is one
chunk. Each timed write upserts one new document, a noisy copy of a random abstract under an id used nowhere
else. Queries: the judged SciFact claims, embedded with retrieval.query_prefix (cached too). No timing includes
embedding: the stores' `prepare` (the catalog's chunk-and-embed) hands over the precomputed vectors, one chunk
per document.

Stores, each holding one MEMORY partition, with the [retrieval] settings of config/ragsidecar.toml, except
that the resident indexes' bound is raised so that every partition stays resident (the bench measures the
stores, not the LRU; the notes print each index's estimated bytes beside retrieval.memory_cache_bytes):
  embedded          store/embedded.py's EmbeddedDocuments on a SQLite file in a temp folder (WAL, commits with
                    synchronous = FULL), its resident incremental index updated by each write before the write
                    is acknowledged. Bulk load: one upsert of every document, then the first `index` (the build).
  postgres A        store/postgres_documents.py's PostgresMemoryStore on a fresh database of a real PostgreSQL
                    18 + pgvector (tests/postgres.py), its own Database pool and resident indexes. Bulk load:
                    upserts of LOAD_BATCH documents (one transaction each), then the first `index`.
  postgres B        a second PostgresMemoryStore (another pool, other resident indexes) on the same database: a
                    second replica. After each write through A, B searches (its `index` catches up from the
                    database) and must find the document.
  0.2.0 rebuild     the reference, run by the code of REFERENCE_COMMIT (the last commit before the incremental
                    indexes) in a process of its own (bench/store_reference.py; needs the repository's history):
                    the immutable HybridIndex (usearch HNSW + bm25s) 0.2.0 rebuilt over a MEMORY partition after
                    every change, built over the same chunks and searched without a store. Its "upsert" is that
                    rebuild after a one-document change (timed up to REBUILT_UP_TO chunks; the partition file's
                    rewrite is not counted, so it is a lower bound); "load s" is the build of the whole partition;
                    RSS is that process's. Its steady searches alternate with the embedded store's query by
                    query (each timed in its own process, the other process idle meanwhile), so that both meet
                    the same moments of a shared machine.
Write: `upsert` of one document, timed until it returns (committed). "after write": right after each write,
`index` (the version check or catch-up) and a hybrid search, timed; the visibility check (a dense search for
the written document's own vector) is not timed. Steady search, per query with no write before it, every
query SEARCH_ROUNDS times: `index`, then hybrid search, k=10 with retrieval.fusion_candidates candidates and the
configured fusion; then the same with the dense side alone (use_lexical=False), whose p50 shows what the lexical
side costs. recall@10: that
dense top 10 against brute-force float32 cosine over every chunk vector of the partition. RSS: the bench
process's resident memory after the store's bulk load (its growth over the load in brackets; the stores run
one after another in one process, so a growth includes the load's garbage and can reuse memory an earlier
store freed). "chunks": what the partition holds at the end, the bulk load and the timed writes.

    .venv/bin/python bench/store.py [--sizes 1000,10000,100000] [--queries 100] [--upserts 100]
                                    [--stores embedded,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import ir_collections
import numpy as np
import psutil
from beir import Embedder, read_collection
from index import exact_top, recall

from ragsidecar.config_loading import load_config
from ragsidecar.knowledge.chunking import Chunk
from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.fusion import FusionSettings
from ragsidecar.knowledge.index import Hit
from ragsidecar.knowledge.ranking import fusion_settings
from ragsidecar.knowledge.sources.units import Unit
from ragsidecar.knowledge.storage import DocumentStore, MemoryDocument, Prepared
from ragsidecar.store.embedded import EmbeddedDocuments
from ragsidecar.store.resident import ResidentIndexes

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO / "tests"))  # tests/postgres.py, imported when a run measures the postgres store

if not (ir_collections.IR_ROOT / "scifact" / "corpus.jsonl.gz").is_file():
    ir_collections.IR_ROOT = REPO / "tests" / "data"  # the vendored subset: the same layout, 390 abstracts


K = 10
NOISE = 0.3
SEED = 14
SOURCE = "notes"
SCOPE = Scope("bench-tenant", "bench-session")
MODEL = "bench:bge-small-en-v1.5"  # the embedder fingerprint the chunks are stored under
LOAD_BATCH = 2000  # documents per bulk-load upsert (postgres)
REBUILT_UP_TO = 10_000  # the 0.2.0 per-write rebuild is timed up to this many chunks (at 100k: 100 s each)
REBUILDS = 3
SEARCH_ROUNDS = 3  # steady searches: every query this many times (hybrid, then dense)
# The last commit before the incremental indexes: its MEMORY index is the "0.2.0 rebuild" reference.
REFERENCE_COMMIT = "a143abdad37dab963c9125b15d2cf303d92512db"
# The fusions that code knows; a newer one configured here runs there as weighted RRF (fusing two lists of at
# most `candidates` hits costs the same, whichever the formula).
REFERENCE_FUSIONS = ("rrf", "weighted_rrf", "convex")
RESIDENT_BYTES = 1 << 40  # every partition stays resident
REQUEST_BYTES = 1 << 40  # the bulk load is one call (embedded)
STORES = ("embedded", "postgres")


@dataclass
class Corpus:
    ids: list[str]
    texts: list[str]
    vectors: np.ndarray  # [n, d] float32, unit rows

    def slice(self, start: int, end: int) -> Corpus:
        return Corpus(self.ids[start:end], self.texts[start:end], self.vectors[start:end])

    @staticmethod
    def joined(parts: list[Corpus]) -> Corpus:
        return Corpus(
            [i for p in parts for i in p.ids],
            [t for p in parts for t in p.texts],
            np.concatenate([p.vectors for p in parts]),
        )

    def documents(self) -> list[MemoryDocument]:
        return [MemoryDocument(i, t, {}) for i, t in zip(self.ids, self.texts, strict=True)]


@dataclass
class Queries:
    texts: list[str]
    vectors: np.ndarray


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def base_set(config, query_count: int) -> tuple[Corpus, Queries]:
    """The SciFact abstracts and judged claims with their real vectors (bench/beir.py's cache, shared)."""
    data = read_collection("scifact")
    claims = list(data.queries.values())
    embedder = Embedder(config)
    try:
        documents = embedder.cached(data.name, data.doc_texts)
        queries = embedder.cached(f"{data.name}-queries", [config.retrieval.query_prefix + c for c in claims])
    finally:
        embedder.close()
    return (
        Corpus(data.doc_ids, data.doc_texts, unit(documents)),
        Queries(claims[:query_count], unit(queries[:query_count])),
    )


def derive(base: Corpus, count: int, rng: np.random.Generator, prefix: str = "") -> Corpus:
    """`count` chunks: base document i mod B, copy i div B (copy 0 unchanged, later copies noisy variants)."""
    size, dimensions = base.vectors.shape
    positions = np.arange(count)
    owner, copy = positions % size, positions // size
    noise = rng.standard_normal((count, dimensions)).astype(np.float32) * (NOISE / np.sqrt(dimensions))
    noise[copy == 0] = 0
    ids = [f"{prefix}{base.ids[b]}-{c}" for b, c in zip(owner, copy, strict=True)]
    texts = [base.texts[b] if c == 0 else f"{base.texts[b]} (variant {c})" for b, c in zip(owner, copy, strict=True)]
    return Corpus(ids, texts, unit(base.vectors[owner] + noise))


def new_documents(base: Corpus, count: int, rng: np.random.Generator) -> list[Corpus]:
    """One document per timed write: a noisy copy of a random abstract, under an id used nowhere else."""
    picked = rng.choice(len(base.ids), count, replace=False)
    sample = Corpus([base.ids[i] for i in picked], [base.texts[i] for i in picked], base.vectors[picked])
    copies = derive(sample, 2 * count, rng, prefix="written-").slice(count, 2 * count)
    return [copies.slice(n, n + 1) for n in range(count)]


# ---- driving a DocumentStore as the server does ---------------------------------------------------------------


class Vectors:
    """The stores' `prepare`: one chunk per document with its precomputed vector, as the catalog's
    chunk-and-embed would hand them over (nothing embedded, nothing timed here that the server would not do)."""

    def __init__(self, analysis: str) -> None:
        self._analysis = analysis
        self._by_id: dict[str, np.ndarray] = {}

    def add(self, corpus: Corpus) -> None:
        self._by_id.update(zip(corpus.ids, corpus.vectors, strict=True))

    async def __call__(self, scope: Scope, name: str, units: list[Unit]) -> Prepared:
        chunks = []
        for position, unit_ in enumerate(units):
            digest = hashlib.sha256(unit_.text.encode("utf-8")).hexdigest()
            chunks.append(
                Chunk(
                    f"{name}:{unit_.provenance.document_id}:{digest[:12]}",
                    name,
                    position,
                    unit_.text,
                    unit_.provenance,
                    digest,
                    0,
                )
            )
        vectors = np.stack([self._by_id[u.provenance.document_id] for u in units]).astype(np.float32)
        return Prepared(MODEL, self._analysis, chunks, vectors)


@dataclass(frozen=True)
class Searching:
    """The [retrieval] settings a SEARCH entry runs with."""

    analysis: str
    candidates: int
    fusion: FusionSettings
    threads: int
    dtype: str
    cache_bytes: int  # retrieval.memory_cache_bytes: the resident indexes' bound the server would apply

    @staticmethod
    def of(config) -> Searching:
        r = config.retrieval
        return Searching(
            r.lexical_language,
            r.fusion_candidates,
            fusion_settings(r),
            r.index_threads,
            r.index_dtype,
            r.memory_cache_bytes,
        )

    def indexes(self, name: str) -> ResidentIndexes:
        return ResidentIndexes(name, RESIDENT_BYTES, self.threads, self.dtype)

    async def search(self, store: DocumentStore, vector: np.ndarray, text: str, use_lexical: bool = True) -> list[Hit]:
        """What the catalog does for a MEMORY source: the partition's index (caught up), then its search."""
        partition = await store.index(SCOPE, SOURCE, MODEL, self.analysis)
        return partition.index.search(vector, text, K, self.candidates, use_lexical=use_lexical, fusion=self.fusion)


# ---- measurement ---------------------------------------------------------------------------------------------


@dataclass
class Figures:
    store: str
    chunks: int
    load_s: float | None = None
    rss: tuple[float, float] | None = None  # MiB after the load, and its growth over the load
    index_mib: float = float("nan")  # the resident index's estimated bytes (what the LRU counts), after the load
    upsert_ms: list[float] = field(default_factory=list)
    after_write_ms: list[float] = field(default_factory=list)
    found: int = 0  # writes the next search found
    search_ms: list[float] = field(default_factory=list)
    dense_ms: list[float] = field(default_factory=list)
    recall: float = float("nan")
    hybrid: list[list[str]] = field(default_factory=list)  # per query, the hybrid top-10 document ids


def p(times: list[float], q: int) -> float:
    return float(np.percentile(times, q)) if times else float("nan")


def documents_of(hits: list[Hit]) -> list[str]:
    return [hit.chunk.meta["document_id"] for hit in hits]


def mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


async def loaded(figures: Figures, load) -> None:
    """Runs the bulk load `load()`, untimed but for its total, and records its time and the RSS after it."""
    gc.collect()
    before, started = mib(), time.perf_counter()
    await load()
    figures.load_s = time.perf_counter() - started
    figures.rss = (mib(), mib() - before)
    print(
        f"  {figures.store}: loaded {figures.chunks:,} chunks in {figures.load_s:.1f} s, RSS {figures.rss[0]:.0f} "
        f"MiB (+{figures.rss[1]:.0f})",
        flush=True,
    )


async def writes(
    writer: DocumentStore,
    readers: list[tuple[DocumentStore, Figures]],
    written: list[Corpus],
    vectors: Vectors,
    queries: Queries,
    searching: Searching,
) -> list[float]:
    """One-document upserts through `writer`, each followed on every reader by a timed search (the next query)
    and an untimed check that the reader finds the document; returns the upserts' times."""
    upsert_ms = []
    for n, document in enumerate(written):
        vectors.add(document)
        started = time.perf_counter()
        await writer.upsert(SCOPE, SOURCE, document.documents())
        upsert_ms.append((time.perf_counter() - started) * 1000)
        query = n % len(queries.texts)
        for reader, figures in readers:
            started = time.perf_counter()
            await searching.search(reader, queries.vectors[query], queries.texts[query])
            figures.after_write_ms.append((time.perf_counter() - started) * 1000)
            own = await searching.search(reader, document.vectors[0], "", use_lexical=False)
            figures.found += document.ids[0] in documents_of(own)
    return upsert_ms


async def searches(
    figures: Figures, search, everything: Corpus, queries: Queries, reference: Reference | None = None
) -> None:
    """Hybrid search over every query, then the dense side alone, each timed, SEARCH_ROUNDS times over, and the
    dense side's recall@10 against brute force. `search(vector, text, use_lexical)` is one search as the server
    runs it. With a reference, its search of each query runs right before or right after ours (in turn), so
    that both meet the same moment of a shared machine: their ratio is what the run compares."""
    dense: list[list[str]] = []
    for use_lexical, times, found in ((True, figures.search_ms, figures.hybrid), (False, figures.dense_ms, dense)):
        compared = (
            [] if reference is None else reference.figures.search_ms if use_lexical else reference.figures.dense_ms
        )
        for round in range(SEARCH_ROUNDS):
            for n, (vector, text) in enumerate(zip(queries.vectors, queries.texts, strict=True)):
                reference_first = reference is not None and (n + round) % 2 == 1
                if reference_first:
                    compared.append((await reference.search(n, use_lexical))[0])
                started = time.perf_counter()
                hits = await search(vector, text if use_lexical else "", use_lexical)
                times.append((time.perf_counter() - started) * 1000)
                if reference is not None and not reference_first:
                    compared.append((await reference.search(n, use_lexical))[0])
                if round == 0:
                    found.append(documents_of(hits))
    figures.recall = dense_recall(dense, everything, queries)
    if reference is not None:
        reference.figures.hybrid = [(await reference.search(n, True))[1] for n in range(len(queries.texts))]
        dense_ids = [(await reference.search(n, False))[1] for n in range(len(queries.texts))]
        reference.figures.recall = dense_recall(dense_ids, everything, queries)


def dense_recall(dense: list[list[str]], everything: Corpus, queries: Queries) -> float:
    """recall@10 of each query's dense top-10 document ids against brute-force cosine over the partition."""
    position = {chunk_id: n for n, chunk_id in enumerate(everything.ids)}
    found = np.array([[position[d] for d in ids] for ids in dense])
    return recall(found, exact_top(everything.vectors, queries.vectors, K))


async def resident_mib(store: DocumentStore, searching: Searching) -> float:
    partition = await store.index(SCOPE, SOURCE, MODEL, searching.analysis)
    return partition.index.nbytes() / 2**20


def store_search(store: DocumentStore, searching: Searching):
    async def search(vector: np.ndarray, text: str, use_lexical: bool) -> list[Hit]:
        return await searching.search(store, vector, text, use_lexical)

    return search


# ---- the stores ------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One size's data, and what every store measures it with."""

    corpus: Corpus  # bulk-loaded
    written: list[Corpus]  # one document per timed write
    queries: Queries
    searching: Searching

    @property
    def everything(self) -> Corpus:
        return Corpus.joined([self.corpus, *self.written])


async def embedded(run: Run, reference: Reference | None) -> list[Figures]:
    vectors = Vectors(run.searching.analysis)
    vectors.add(run.corpus)
    figures = Figures("embedded", len(run.everything.ids))
    with tempfile.TemporaryDirectory(prefix="bench-store-") as folder:
        store = EmbeddedDocuments(
            Path(folder) / "memory.sqlite3",
            vectors,
            run.searching.indexes("bench_embedded"),
            name="bench_embedded_store",
            max_request_bytes=REQUEST_BYTES,
        )
        try:

            async def load() -> None:
                await store.upsert(SCOPE, SOURCE, run.corpus.documents())
                await store.index(SCOPE, SOURCE, MODEL, run.searching.analysis)

            await loaded(figures, load)
            figures.index_mib = await resident_mib(store, run.searching)
            figures.upsert_ms = await writes(
                store, [(store, figures)], run.written, vectors, run.queries, run.searching
            )
            await searches(figures, store_search(store, run.searching), run.everything, run.queries, reference)
        finally:
            store.close()
    return [figures]


def reference_tree(folder: Path) -> Path | None:
    """REFERENCE_COMMIT's server/src extracted under `folder`; None without the repository's history."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", REFERENCE_COMMIT, "server/src/ragsidecar"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        print(f"no 0.2.0 reference: git archive {REFERENCE_COMMIT[:12]} failed ({err})", flush=True)
        return None
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "server" / "src"


class Reference:
    """0.2.0's MEMORY index, by 0.2.0's code (bench/store_reference.py in a process of its own): built from
    scratch over the partition, rebuilt after a one-document change up to REBUILT_UP_TO chunks, then searched
    query by query on demand, so that its searches alternate with the embedded store's in one run."""

    def __init__(self, worker: asyncio.subprocess.Process, folder: tempfile.TemporaryDirectory, figures: Figures):
        self._worker, self._folder, self.figures = worker, folder, figures

    @staticmethod
    async def start(run: Run, tree: Path) -> Reference:
        everything, searching = run.everything, run.searching
        loaded = len(run.corpus.ids)
        rebuilds = [loaded + n + 1 for n in range(min(REBUILDS, len(run.written)))] if loaded <= REBUILT_UP_TO else []
        folder = tempfile.TemporaryDirectory(prefix="bench-store-")
        job = Path(folder.name)
        np.save(job / "vectors.npy", everything.vectors)
        np.save(job / "queries.npy", run.queries.vectors)
        fusion = searching.fusion.method if searching.fusion.method in REFERENCE_FUSIONS else "weighted_rrf"
        (job / "job.json").write_text(
            json.dumps(
                {
                    "ids": everything.ids,
                    "texts": everything.texts,
                    "queries": run.queries.texts,
                    "rebuilds": rebuilds,
                    "k": K,
                    "candidates": searching.candidates,
                    "fusion": fusion,
                    "dense_weight": searching.fusion.dense_weight,
                    "threads": searching.threads,
                    "dtype": searching.dtype,
                    "analysis": searching.analysis,
                }
            )
        )
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            str(REPO / "bench" / "store_reference.py"),
            folder.name,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 24,
        )
        reference = Reference(worker, folder, Figures("0.2.0 rebuild", len(everything.ids)))
        built = await reference._answer()
        if not built["package"].startswith(str(tree)):
            raise SystemExit(f"the reference ran {built['package']}, not {REFERENCE_COMMIT[:12]}'s code")
        figures = reference.figures
        figures.load_s, figures.rss = built["build_s"], (built["rss_mib"], built["rss_growth_mib"])
        figures.upsert_ms = built["rebuild_ms"]
        print(
            f"  {figures.store}: built {figures.chunks:,} chunks in {figures.load_s:.1f} s, RSS "
            f"{figures.rss[0]:.0f} MiB (+{figures.rss[1]:.0f}; a process of its own)",
            flush=True,
        )
        return reference

    async def search(self, query: int, use_lexical: bool) -> tuple[float, list[str]]:
        """Query number `query` searched by the worker, timed there (ms), and its top-k document ids."""
        self._worker.stdin.write(f"{'hybrid' if use_lexical else 'dense'} {query}\n".encode())
        await self._worker.stdin.drain()
        found = await self._answer()
        return found["ms"], found["ids"]

    async def _answer(self) -> dict:
        line = await self._worker.stdout.readline()
        if not line:
            raise SystemExit(f"bench/store_reference.py failed (exit {await self._worker.wait()})")
        return json.loads(line)

    async def close(self) -> None:
        self._worker.stdin.close()
        await self._worker.wait()
        self._folder.cleanup()


async def postgres(run: Run, server, size: int) -> tuple[list[Figures], str]:
    """Two replicas (two pools, two sets of resident indexes) of the PostgreSQL store on one fresh database."""
    from ragsidecar.store.database import Database
    from ragsidecar.store.postgres_documents import PostgresMemoryStore

    dsn = server.database(f"bench_store_{size}")
    vectors = Vectors(run.searching.analysis)
    vectors.add(run.corpus)
    databases = [Database(dsn, pool_size=2, row_level_security=False) for _ in range(2)]
    try:
        for database in databases:
            await database.start()
            if not database.healthy:
                raise SystemExit("the benchmark's PostgreSQL is unreachable")
        a, b = (
            PostgresMemoryStore(
                database,
                namespace="memory",
                prepare=vectors,
                indexes=run.searching.indexes(f"bench_postgres_{name}"),
                max_request_bytes=REQUEST_BYTES,
            )
            for name, database in zip("ab", databases, strict=True)
        )
        first, second = (Figures(f"postgres {name}", len(run.everything.ids)) for name in ("A", "B"))

        async def load() -> None:
            for start in range(0, len(run.corpus.ids), LOAD_BATCH):
                await a.upsert(SCOPE, SOURCE, run.corpus.slice(start, start + LOAD_BATCH).documents())
            await a.index(SCOPE, SOURCE, MODEL, run.searching.analysis)

        async def catch_up() -> None:
            await b.index(SCOPE, SOURCE, MODEL, run.searching.analysis)

        await loaded(first, load)
        first.index_mib = await resident_mib(a, run.searching)
        await loaded(second, catch_up)
        first.upsert_ms = await writes(a, [(a, first), (b, second)], run.written, vectors, run.queries, run.searching)
        for store, figures in ((a, first), (b, second)):
            await searches(figures, store_search(store, run.searching), run.everything, run.queries)
        size_mib, version = databases[0].run_sync(
            lambda c: c.execute(
                "SELECT pg_database_size(current_database()) / 1048576.0, current_setting('server_version') || "
                "', pgvector ' || (SELECT extversion FROM pg_extension WHERE extname = 'vector')"
            ).fetchone()
        )
        return [first, second], f"PostgreSQL {version}; database {size_mib:.0f} MiB"
    finally:
        for database in databases:
            await database.close()


def agreement(a: Figures, b: Figures) -> float:
    return float(np.mean([len(set(x) & set(y)) / max(len(x), 1) for x, y in zip(a.hybrid, b.hybrid, strict=True)]))


async def one_size(
    size: int,
    base: Corpus,
    queries: Queries,
    upserts: int,
    stores: list[str],
    server,
    tree: Path | None,
    searching: Searching,
) -> tuple[list[Figures], list[str]]:
    rng = np.random.default_rng(SEED)
    run = Run(derive(base, size, rng), new_documents(base, upserts, rng), queries, searching)
    print(f"{size:,} chunks:", flush=True)
    figures, notes = [], []
    if "embedded" in stores:
        reference = await Reference.start(run, tree) if tree is not None else None
        try:
            figures += await embedded(run, reference)
        finally:
            if reference is not None:
                await reference.close()
        if reference is not None:
            figures.append(reference.figures)
        gc.collect()
    if "postgres" in stores:
        replicas, database = await postgres(run, server, size)
        figures += replicas
        notes.append(f"postgres: {database}")
        gc.collect()
    by_name = {f.store: f for f in figures}
    if "embedded" in by_name and "postgres A" in by_name:
        notes.append(
            f"hybrid top-10 agreement embedded vs postgres A "
            f"{agreement(by_name['embedded'], by_name['postgres A']):.3f}"
        )
    for f in figures:
        if not np.isnan(f.index_mib):
            notes.append(
                f"{f.store}'s resident index {f.index_mib:.0f} MiB (estimated; retrieval.memory_cache_bytes "
                f"{searching.cache_bytes / 2**20:.0f} MiB)"
            )
        if f.after_write_ms:
            notes.append(f"{f.store}: {f.found}/{len(f.after_write_ms)} written documents found by the next search")
    return figures, [f"- {size:,} chunks: " + "; ".join(notes)] if notes else []


# ---- report --------------------------------------------------------------------------------------------------


def cell(value: float, digits: int = 1) -> str:
    return "-" if np.isnan(value) else f"{value:.{digits}f}"


def row(f: Figures) -> str:
    rss = "-" if f.rss is None else f"{f.rss[0]:.0f} (+{f.rss[1]:.0f})"
    return (
        f"| {f.chunks:,} | {f.store} | {cell(f.load_s if f.load_s is not None else float('nan'))} "
        f"| {cell(p(f.upsert_ms, 50))} | {cell(p(f.upsert_ms, 95))} | {cell(p(f.after_write_ms, 50), 2)} "
        f"| {cell(p(f.search_ms, 50), 2)} | {cell(p(f.search_ms, 95), 2)} | {cell(p(f.dense_ms, 50), 2)} "
        f"| {cell(f.recall, 4)} | {rss} |"
    )


def ratios(figures: list[Figures]) -> list[str]:
    """The ratios the figures are judged by: growth with size, search after a write against a steady one, and
    the steady search against the 0.2.0 rebuilt index."""
    by = {(f.store, f.chunks): f for f in figures}
    sizes = sorted({f.chunks for f in figures})
    lines = []
    for store in ("embedded", "postgres A"):
        first, last = by.get((store, sizes[0])), by.get((store, sizes[-1]))
        if first and last and first is not last:
            lines.append(
                f"- {store}: upsert p50 at {sizes[-1]:,} chunks is "
                f"{p(last.upsert_ms, 50) / p(first.upsert_ms, 50):.2f}x "
                f"the p50 at {sizes[0]:,}"
            )
    for f in figures:
        if f.after_write_ms:
            # Write n searched query n: the steady searches of those same queries are the fair comparison.
            steady = [f.search_ms[n % len(f.search_ms)] for n in range(len(f.after_write_ms))]
            lines.append(
                f"- {f.chunks:,} {f.store}: search right after a write p50 "
                f"{p(f.after_write_ms, 50) / p(steady, 50):.2f}x "
                f"a steady search p50 of the same queries"
            )
        reference = by.get(("0.2.0 rebuild", f.chunks))
        if f.store == "embedded" and reference:
            lines.append(
                f"- {f.chunks:,} embedded: steady search p50 {p(f.search_ms, 50) / p(reference.search_ms, 50):.2f}x "
                f"the 0.2.0 rebuilt index's"
            )
    return lines


def derived_spread(base: Corpus) -> str:
    """How close the derived copies sit to their originals, next to how close real neighbours are."""
    rng = np.random.default_rng(SEED)
    sample = base.slice(0, min(len(base.ids), 2000))
    copies = derive(sample, 2 * len(sample.ids), rng).vectors[len(sample.ids) :]
    to_original = np.einsum("nd,nd->n", copies, sample.vectors)
    similarity = sample.vectors @ base.vectors.T
    similarity[np.arange(len(sample.ids)), np.arange(len(sample.ids))] = -1
    return (
        f"median cosine of a copy to its original {np.median(to_original):.3f}; of a real abstract to its "
        f"nearest other abstract {np.median(similarity.max(axis=1)):.3f}"
    )


async def measure_all(args, base: Corpus, queries: Queries, searching: Searching, stores: list[str]):
    server = None
    if "postgres" in stores:
        from postgres import Postgres

        server = Postgres()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-store-0.2.0-") as folder:
            tree = reference_tree(Path(folder)) if "embedded" in stores else None
            return [
                await one_size(int(s), base, queries, args.upserts, stores, server, tree, searching)
                for s in args.sizes.split(",")
            ]
    finally:
        if server is not None:
            server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="bulk-loaded chunks per partition")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--upserts", type=int, default=100, help="timed one-document writes per size and store")
    parser.add_argument("--stores", default=",".join(STORES))
    args = parser.parse_args()
    stores = args.stores.split(",")
    if unknown := set(stores) - set(STORES):
        parser.error(f"unknown stores {sorted(unknown)}; known: {', '.join(STORES)}")
    overall = time.perf_counter()
    load_start = os.getloadavg()[0]
    config = load_config(REPO / "config" / "ragsidecar.toml", environ={})
    searching = Searching.of(config)
    base, queries = base_set(config, args.queries)
    results = asyncio.run(measure_all(args, base, queries, searching, stores))
    figures = [f for size, _ in results for f in size]
    lines = [
        "# MEMORY store: embedded vs PostgreSQL",
        "",
        f"`.venv/bin/python bench/store.py --sizes {args.sizes} --queries {args.queries} --upserts {args.upserts} "
        f"--stores {args.stores}`: one partition, one chunk per document; {len(base.ids)} SciFact abstracts with "
        f"real bge-small-en-v1.5 vectors and noisy copies of them (NOISE {NOISE}: {derived_spread(base)}); "
        f"{len(queries.texts)} SciFact claims as queries. Upsert: one new document, timed until acknowledged "
        f"(committed: durable), vectors precomputed. After write: the search right after each write. Search: "
        f"`index` then hybrid, k={K}, {searching.candidates} candidates, {searching.fusion.method} fusion "
        f"(dense weight {searching.fusion.dense_weight}), lexical analysis {searching.analysis!r}, HNSW "
        f"{searching.dtype} with {searching.threads} thread(s), query embedding excluded; dense: the dense side "
        f"alone. recall@10: the dense side's top 10 against exact float32 cosine over the whole partition. "
        f"RSS: the bench process after the load (growth in brackets).",
        "",
        "| chunks | store | load s | upsert p50 ms | upsert p95 ms | after write p50 ms | search p50 ms "
        "| search p95 ms | dense p50 ms | recall@10 | RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(row(f) for f in figures),
        "",
        *ratios(figures),
        *(note for _, notes in results for note in notes),
        "",
        f"{os.cpu_count()} cores, load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end; "
        f"total {time.perf_counter() - overall:.0f} s.",
    ]
    table = "\n".join(lines) + "\n"
    print("\n" + table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "store.md").write_text(table)


if __name__ == "__main__":
    main()
