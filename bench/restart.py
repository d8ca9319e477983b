"""Restarts, evictions and new replicas: what a MEMORY partition's first search costs, with and without its
index snapshot (store/snapshots.py), side by side in one run for the embedded store and a PostgreSQL replica.

Data as bench/store.py makes it (SciFact abstracts with their real bge-small-en-v1.5 vectors plus noisy copies,
one chunk per document, 384 dimensions; its queries, embedding excluded). Per size and store, driven through the
store's DocumentStore calls as the server drives them, with the default [retrieval] and [store] settings:

  built         the first search of a partition no index or snapshot of which exists: embedded, the build from
                the SQLite rows after the bulk load; postgres, a replica with no snapshot (a fresh data folder)
                loading the partition from the database.
  read s        postgres: the bulk read alone of the partition's chunks and vectors that "built" starts with (one
                statement, as the replica reads them), so the rest of "built" is the index's build.
  snapshot s    the background snapshot's write (after the build, the partition idle); for postgres, with its
                upload to the database when the partition holds store.shared_snapshot_chunks (5000) or more.
  replica       postgres: a third replica with no snapshot of its own (a fresh data folder), after the
                WRITES_AFTER writes: its first search, which downloads the snapshot shared through the database
                and replays those writes (below shared_snapshot_chunks: a build from the rows, as "built").
  restart       after WRITES_AFTER one-document upserts made once the snapshot was written, the store closed
                and opened again on the same data folder (and database): the first search, which loads the
                snapshot and replays those writes.
  evicted       a store whose resident bound (retrieval.memory_cache_bytes) is too small to keep the index, so
                every search opens it again: the p50 of EVICTED_SEARCHES such searches (each a snapshot load).
  steady        p50 of the queries searched on the resident index (index + hybrid search).
  8 vs 1        searches per second of 8 threads searching the resident index at once over one at a time; in
                brackets, the same ratio for work that holds no GIL (numpy's sine of 131,072 numbers), measured
                alternately with the searches: how much of a second core the shared host left free meanwhile (2 idle
                cores: about 2).
  recall@10     the dense side's top 10 against exact float32 cosine.
  KB/chunk      a process of its own opens the store from the snapshot and searches 20 times: its private
                resident memory (RssAnon) over what it held before opening (imports done, models not loaded), per
                chunk; "mapped" beside it, the file pages it has mapped meanwhile (RssFile: the snapshot's vectors a
                search rescores with, shared page cache the kernel reclaims under pressure, not the process's).

    .venv/bin/python bench/restart.py [--sizes 1000,10000] [--stores embedded,postgres] [--queries 50]
                                      [--vectors real|synthetic]
    (add 100000 to --sizes for the 100k figures: its build takes minutes on 2 shared cores)

--vectors synthetic keeps the SciFact texts but draws the base vectors from bench/index.py's clustered
generator (and the queries' too), for a machine where embedding the 5183 abstracts once (bench/beir.py's cache)
is too slow: the times and memory do not depend on what the vectors mean; recall@10 is then that of the
clustered set.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from beir import read_collection
from index import clustered
from store import (
    LOAD_BATCH,
    MODEL,
    REPO,
    REQUEST_BYTES,
    RESIDENT_BYTES,
    SCOPE,
    SEED,
    SOURCE,
    Corpus,
    Queries,
    Searching,
    Vectors,
    base_set,
    dense_recall,
    derive,
    documents_of,
    new_documents,
    p,
)

from ragsidecar.config import StoreConfig
from ragsidecar.config_loading import load_config
from ragsidecar.knowledge.storage import DocumentStore
from ragsidecar.store.snapshots import SnapshotPolicy

RESULTS = REPO / "bench" / "results"
WRITES_AFTER = 20
EVICTED_SEARCHES = 5
RSS_SEARCHES = 20
CONCURRENCY = 8
# The GIL-free reference of "8 vs 1": calls per measurement, each the sine of these numbers.
GIL_FREE_CALLS = 400
GIL_FREE_BLOCK = np.linspace(0.0, 1.0, 1 << 17)
STORES = ("embedded", "postgres")


@dataclass
class Figures:
    store: str
    chunks: int
    built_s: float = float("nan")
    read_s: float = float("nan")
    snapshot_s: float = float("nan")
    replica_s: float = float("nan")
    restart_s: float = float("nan")
    evicted_s: list[float] = field(default_factory=list)
    steady_ms: list[float] = field(default_factory=list)
    parallel: float = float("nan")  # 8 threads' searches per second over one thread's
    parallel_free: float = float("nan")  # the same for work that holds no GIL (gil_free)
    recall: float = float("nan")
    kb_per_chunk: float = float("nan")
    mapped_kb_per_chunk: float = float("nan")


class Opener:
    """Opens (and reopens) one backend's MEMORY store on one data folder (and, for postgres, one database)."""

    def __init__(self, backend: str, data: Path, vectors: Vectors, searching: Searching, dsn: str = "") -> None:
        self.backend, self.data, self.vectors, self.searching, self.dsn = backend, data, vectors, searching, dsn
        self._closers: list[Callable[[], Awaitable[None]]] = []

    async def open(self, resident_bytes: int = RESIDENT_BYTES) -> DocumentStore:
        policy = SnapshotPolicy()
        if self.backend == "embedded":
            from ragsidecar.store.embedded import EmbeddedBackend

            backend = EmbeddedBackend(
                self.data, resident_bytes, 1 << 20, REQUEST_BYTES, self.searching.threads, self.searching.dtype, policy
            )
            self._closers.append(backend.close)
            return backend.documents("memory", self.vectors)
        from ragsidecar.config import Config, PathsConfig, RetrievalConfig, StoreConfig
        from ragsidecar.store.database import open_database
        from ragsidecar.store.postgres import PostgresBackend

        config = Config(
            paths=PathsConfig(data_dir=str(self.data)),
            retrieval=RetrievalConfig(
                memory_cache_bytes=resident_bytes,
                index_threads=self.searching.threads,
                index_dtype=self.searching.dtype,
            ),
            store=StoreConfig(backend="postgres", pool_size=2),
        )
        database = open_database(config, {"RAGSIDECAR_STORE_DSN": self.dsn})
        assert database is not None
        postgres = PostgresBackend(config, database)
        await postgres.start()
        self._closers.append(postgres.close)
        return postgres.documents("memory", self.vectors)

    async def close(self) -> None:
        for close in self._closers:
            await close()
        self._closers.clear()


async def first_search(store: DocumentStore, searching: Searching, queries: Queries) -> float:
    started = time.perf_counter()
    await searching.search(store, queries.vectors[0], queries.texts[0])
    return time.perf_counter() - started


def snapshot_written(data: Path, after: float, timeout: float = 1800.0) -> float:
    """Seconds from `after` (a perf_counter time) until a snapshot manifest newer than it is under `data`."""
    deadline = time.monotonic() + timeout
    wall = time.time() - (time.perf_counter() - after)
    while time.monotonic() < deadline:
        for manifest in (data / "snapshots").glob("*/*/manifest.json"):
            if not manifest.parent.name.startswith(".") and manifest.stat().st_mtime > wall:
                return manifest.stat().st_mtime - wall
        time.sleep(0.05)
    raise SystemExit(f"no snapshot under {data} after {timeout} s")


def shared_written(dsn: str, after: float, size: int, timeout: float = 1800.0) -> float:
    """Seconds from `after` (a perf_counter time) until the snapshot is shared through the database (now, when the
    partition is below the default store.shared_snapshot_chunks: none will be)."""
    import psycopg

    if size < StoreConfig().shared_snapshot_chunks:
        return time.perf_counter() - after
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as connection:
        while time.monotonic() < deadline:
            if connection.execute("SELECT count(*) FROM ragsidecar_memory_snapshots").fetchone() != (0,):
                return time.perf_counter() - after
            time.sleep(0.05)
    raise SystemExit(f"no snapshot shared after {timeout} s")


def bulk_read(dsn: str) -> float:
    """Seconds the bulk read of the (one) partition's chunks and vectors takes, as a replica with no snapshot
    reads them (store/postgres_documents.py), rows decoded into keys, chunks and float32 vectors."""
    import psycopg

    from ragsidecar.store.postgres_documents import _space_chunks

    with psycopg.connect(dsn) as connection:
        space, tenant = connection.execute("SELECT id, tenant FROM ragsidecar_memory_spaces").fetchone() or (0, "")
        started = time.perf_counter()
        _space_chunks(connection, tenant, space)
        return time.perf_counter() - started


async def steady(figures: Figures, store: DocumentStore, searching: Searching, queries: Queries, corpus: Corpus):
    dense = []
    for vector, text in zip(queries.vectors, queries.texts, strict=True):
        started = time.perf_counter()
        await searching.search(store, vector, text)
        figures.steady_ms.append((time.perf_counter() - started) * 1000)
        dense.append(documents_of(await searching.search(store, vector, "", use_lexical=False)))
    figures.recall = dense_recall(dense, corpus, queries)
    partition = await store.index(SCOPE, SOURCE, MODEL, searching.analysis)

    def search(n: int) -> None:
        i = n % len(queries.texts)
        partition.index.search(queries.vectors[i], queries.texts[i], 10, searching.candidates, fusion=searching.fusion)

    rates: dict[Callable[[int], None], list[float]] = {search: [], gil_free: []}
    for threads in (1, CONCURRENCY, 1, CONCURRENCY):  # interleaved: all meet the same moments of the machine
        for work, count in ((search, 8 * len(queries.texts)), (gil_free, GIL_FREE_CALLS)):
            with ThreadPoolExecutor(threads) as pool:
                started = time.perf_counter()
                list(pool.map(work, range(count)))
                rates[work].append(count / (time.perf_counter() - started))
    figures.parallel, figures.parallel_free = ((r[1] + r[3]) / (r[0] + r[2]) for r in (rates[search], rates[gil_free]))


def gil_free(_: int) -> None:
    """About a millisecond of work on one core without the GIL (a numpy ufunc's loop lets go of it). Not hashing:
    hashlib's sha256 reached 1.19 times one thread with 2 (numpy's sine 1.71) on the same host."""
    np.sin(GIL_FREE_BLOCK)


def resident_kb_per_chunk(backend: str, data: Path, dsn: str, chunks: int) -> tuple[float, float]:
    """A process of its own opens the store on `data` from its snapshot and searches: (private, mapped) KB/chunk."""
    out = subprocess.run(
        [sys.executable, __file__, "--measure-rss", backend, str(data), dsn],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    ).stdout
    grown = json.loads(out.strip().splitlines()[-1])
    return grown["private_bytes"] / chunks / 1024, grown["mapped_bytes"] / chunks / 1024


def resident_bytes() -> tuple[int, int]:
    """The process's private (RssAnon) and file-mapped (RssFile) resident bytes."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(status["RssAnon"].split()[0]) * 1024, int(status["RssFile"].split()[0]) * 1024


async def measure_rss(backend: str, data: Path, dsn: str) -> None:
    config = load_config(REPO / "config" / "ragsidecar.toml", environ={})
    searching = Searching.of(config)
    opener = Opener(backend, data, Vectors(searching.analysis), searching, dsn)
    import ragsidecar.store.embedded  # noqa: F401 - loaded before measuring: the process's empty size holds the code
    import ragsidecar.store.postgres  # noqa: F401

    rng = np.random.default_rng(SEED)
    gc.collect()
    private, mapped = resident_bytes()
    store = await opener.open()
    partition = await store.index(SCOPE, SOURCE, MODEL, searching.analysis)
    for _ in range(RSS_SEARCHES):
        vector = rng.standard_normal(384).astype(np.float32)
        partition.index.search(vector, "cell", 10, searching.candidates, fusion=searching.fusion)
    gc.collect()
    private_after, mapped_after = resident_bytes()
    await opener.close()
    print(json.dumps({"private_bytes": private_after - private, "mapped_bytes": mapped_after - mapped}))


async def one_store(
    backend: str, size: int, corpus: Corpus, written: list[Corpus], queries: Queries, searching: Searching, server
) -> Figures:
    vectors = Vectors(searching.analysis)
    vectors.add(corpus)
    for document in written:
        vectors.add(document)
    figures = Figures(backend, size + len(written))
    dsn = server.database(f"bench_restart_{size}") if backend == "postgres" else ""
    with tempfile.TemporaryDirectory(prefix=f"bench-restart-{backend}-") as folder:
        data = Path(folder)
        writer = Opener(backend, data / "writer", vectors, searching, dsn)
        store = await writer.open()
        for start in range(0, len(corpus.ids), LOAD_BATCH):
            await store.upsert(SCOPE, SOURCE, corpus.slice(start, start + LOAD_BATCH).documents())
        if backend == "postgres":  # the writer is replica A; B is the replica measured, with a data folder of its own
            replica = Opener(backend, data / "replica", vectors, searching, dsn)
            searched, searched_data = await replica.open(), data / "replica"
        else:
            replica, searched, searched_data = writer, store, data / "writer"
        started = time.perf_counter()
        figures.built_s = await first_search(searched, searching, queries)
        figures.snapshot_s = snapshot_written(searched_data, started) - figures.built_s
        if backend == "postgres":
            figures.snapshot_s = shared_written(dsn, started, size) - figures.built_s
            figures.read_s = bulk_read(dsn)
        everything = Corpus.joined([corpus, *written])
        for document in written:
            await store.upsert(SCOPE, SOURCE, document.documents())
        await steady(figures, searched, searching, queries, everything)
        await replica.close()
        if backend == "postgres":
            joining = Opener(backend, data / "joining", vectors, searching, dsn)
            figures.replica_s = await first_search(await joining.open(), searching, queries)
            await joining.close()
        await writer.close()

        restarted = Opener(backend, searched_data, vectors, searching, dsn)
        figures.restart_s = await first_search(await restarted.open(), searching, queries)
        await restarted.close()
        evicting = Opener(backend, searched_data, vectors, searching, dsn)
        store = await evicting.open(resident_bytes=1)
        figures.evicted_s = [await first_search(store, searching, queries) for _ in range(EVICTED_SEARCHES)]
        await evicting.close()
        figures.kb_per_chunk, figures.mapped_kb_per_chunk = resident_kb_per_chunk(
            backend, searched_data, dsn, figures.chunks
        )
    print(f"  {backend}: {row(figures)}", flush=True)
    return figures


def row(f: Figures) -> str:
    return (
        f"| {f.chunks:,} | {f.store} | {f.built_s:.2f} | {f.read_s:.2f} | {f.snapshot_s:.2f} | {f.replica_s:.2f} | "
        f"{f.restart_s * 1000:.0f} | {p(f.evicted_s, 50) * 1000:.0f} | {p(f.steady_ms, 50):.2f} | "
        f"{f.parallel:.2f} ({f.parallel_free:.2f}) | {f.recall:.4f} | "
        f"{f.kb_per_chunk:.1f} | {f.mapped_kb_per_chunk:.1f} |"
    )


def synthetic_base(query_count: int) -> tuple[Corpus, Queries]:
    """SciFact's texts with clustered synthetic vectors (bench/index.py), nothing embedded."""
    data = read_collection("scifact")
    claims = list(data.queries.values())[:query_count]
    vectors, query_vectors = clustered(len(data.doc_ids), len(claims))
    return Corpus(data.doc_ids, data.doc_texts, vectors), Queries(claims, query_vectors)


async def measure_all(sizes: list[int], stores: list[str], query_count: int, synthetic: bool) -> list[Figures]:
    config = load_config(REPO / "config" / "ragsidecar.toml", environ={})
    searching = Searching.of(config)
    base, queries = synthetic_base(query_count) if synthetic else base_set(config, query_count)
    server = None
    if "postgres" in stores:
        sys.path.insert(0, str(REPO / "tests"))
        from postgres import Postgres

        server = Postgres()
    try:
        figures = []
        for size in sizes:
            rng = np.random.default_rng(SEED)
            corpus, written = derive(base, size, rng), new_documents(base, WRITES_AFTER, rng)
            print(f"{size:,} chunks:", flush=True)
            for backend in stores:
                figures.append(await one_store(backend, size, corpus, written, queries, searching, server))
        return figures
    finally:
        if server is not None:
            server.close()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--measure-rss":
        asyncio.run(measure_rss(sys.argv[2], Path(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else ""))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="bulk-loaded chunks per partition (100000: minutes)")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--vectors", choices=("real", "synthetic"), default="real")
    args = parser.parse_args()
    stores = args.stores.split(",")
    if unknown := set(stores) - set(STORES):
        parser.error(f"unknown stores {sorted(unknown)}; known: {', '.join(STORES)}")
    overall, load_start = time.perf_counter(), os.getloadavg()[0]
    sizes = [int(s) for s in args.sizes.split(",")]
    figures = asyncio.run(measure_all(sizes, stores, args.queries, args.vectors == "synthetic"))
    lines = [
        "# Restarts, evictions and new replicas",
        "",
        f"`.venv/bin/python bench/restart.py --sizes {args.sizes} --stores {args.stores} --queries {args.queries} "
        f"--vectors {args.vectors}`"
        " (the docstring says what each column times). built: the first search with no index and no snapshot "
        "(postgres: a replica with no snapshot, none shared); replica: a replica with no snapshot of its own, one "
        "shared through the database; restart and evicted: the first search from the snapshot.",
        "",
        "| chunks | store | built s | read s | snapshot s | replica s | restart ms | evicted p50 ms | steady p50 ms | "
        "8 vs 1 (GIL-free) | recall@10 | KB/chunk | mapped KB/chunk |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(row(f) for f in figures),
        "",
        f"{os.cpu_count()} cores, load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end; "
        f"total {time.perf_counter() - overall:.0f} s.",
    ]
    table = "\n".join(lines) + "\n"
    print("\n" + table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "restart.md").write_text(table)


if __name__ == "__main__":
    main()
