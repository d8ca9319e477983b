"""Reads beside writes and each other: this checkout's index against REFERENCE_COMMIT's (the last before searches
gathered their graph calls and let go of the lock to fuse), side by side in one process on one snapshot.

The partition is made as bench/lean_reference.py makes it (bench/restart.py's data: SciFact abstracts with clustered
synthetic vectors, the embedded store's bulk load and background snapshot); both indexes load that snapshot. Then,
alternating between them round by round so both meet the same moments of a shared machine:

  same hits     whether both return the same hits (ids and fused scores) for every query. NO since the graph is
                asked for GRAPH_OVERSAMPLE times the candidates (knowledge/index.py): this checkout's dense lists
                are nearer the exact ones than REFERENCE_COMMIT's.
  CPU p50       a steady search's thread time, p50 over the rounds (k 10, retrieval.fusion_candidates, the fusion).
  8 vs 1        searches per second of 8 threads at once over one at a time; "GIL-free" the same for work that
                lets go of the GIL (bench/restart.py's gil_free): how much of a second core the host left free
                meanwhile (2 idle cores: about 2).
  change ms     p50 and p95 of a one-chunk replacement made while 6 threads search the index.

    .venv/bin/python bench/reads.py [--sizes 20000,100000] [--queries 30] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

from lean_reference import reference_module, snapshot_of
from restart import GIL_FREE_CALLS, gil_free, synthetic_base
from store import REPO, Queries, Searching

from ragsidecar.config_loading import load_config
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk

REFERENCE_COMMIT = "492f99b"
CONCURRENCY = 8
SEARCHERS_BESIDE_CHANGES = 6
CHANGES_PER_ROUND = 15


def rate(work: Callable[[int], object], threads: int, count: int) -> float:
    with ThreadPoolExecutor(threads) as pool:
        started = time.perf_counter()
        list(pool.map(work, range(count)))
        return count / (time.perf_counter() - started)


class Side:
    """One index's figures over the rounds."""

    def __init__(self, index: Any, chunk: Callable[..., Any], vector: Any) -> None:
        self.index, self.chunk, self.vector = index, chunk, vector  # the reference's own classes; a change's vector
        self.cpu: list[float] = []
        self.rates: list[tuple[float, float]] = []
        self.changes: list[float] = []

    def hits(self, queries: Queries, searching: Searching, i: int) -> list[tuple[str, float]]:
        found = self.index.search(
            queries.vectors[i], queries.texts[i], 10, searching.candidates, fusion=searching.fusion
        )
        return [(h.chunk.id, h.fused) for h in found]

    def round(self, queries: Queries, searching: Searching, number: int) -> None:
        n = len(queries.texts)
        for i in range(n):
            started = time.thread_time()
            self.hits(queries, searching, i)
            self.cpu.append(time.thread_time() - started)

        def search(i: int) -> None:
            self.hits(queries, searching, i % n)

        self.rates.append((rate(search, 1, 4 * n), rate(search, CONCURRENCY, 4 * n)))
        self.change_beside_searches(search, number)

    def change_beside_searches(self, search: Callable[[int], None], number: int) -> None:
        stop = threading.Event()

        def searching(worker: int) -> None:
            i = worker
            while not stop.is_set():
                search(i)
                i += 1

        threads = [threading.Thread(target=searching, args=(w,)) for w in range(SEARCHERS_BESIDE_CHANGES)]
        for thread in threads:
            thread.start()
        try:
            for j in range(CHANGES_PER_ROUND):
                key = f"bench-reads-{number}-{j}"
                started = time.perf_counter()
                self.index.update([], [self.chunk(key, f"a change {key}", {})], self.vector, [key])
                self.changes.append(time.perf_counter() - started)
                time.sleep(0.01)
        finally:
            stop.set()
            for thread in threads:
                thread.join()

    def row(self, name: str, free: list[tuple[float, float]]) -> str:
        one, eight = sum(a for a, _ in self.rates), sum(b for _, b in self.rates)
        free_ratio = sum(b for _, b in free) / sum(a for a, _ in free)
        changes = sorted(self.changes)
        return (
            f"{name} | {statistics.median(self.cpu) * 1000:.2f} | {eight / one:.2f} ({free_ratio:.2f}) | "
            f"{statistics.median(changes) * 1000:.1f} | {changes[int(len(changes) * 0.95)] * 1000:.1f}"
        )


def compare(folder: Path, reference: ModuleType, searching: Searching, queries: Queries, rounds: int) -> list[str]:
    before = Side(reference.HybridIndex.load(folder), reference.IndexedChunk, queries.vectors[:1])
    after = Side(HybridIndex.load(folder), IndexedChunk, queries.vectors[:1])
    same = all(
        before.hits(queries, searching, i) == after.hits(queries, searching, i) for i in range(len(queries.texts))
    )
    free: list[tuple[float, float]] = []
    for number in range(rounds):
        for side in (before, after) if number % 2 else (after, before):
            side.round(queries, searching, 2 * number + (side is after))
        free.append((rate(gil_free, 1, GIL_FREE_CALLS), rate(gil_free, CONCURRENCY, GIL_FREE_CALLS)))
    return [before.row(f"{REFERENCE_COMMIT} | {'yes' if same else 'NO'}", free), after.row("this checkout | ", free)]


async def measure(sizes: list[int], query_count: int, rounds: int) -> list[str]:
    config = load_config(REPO / "config" / "ragsidecar.toml", environ={})
    searching = Searching.of(config)
    base, queries = synthetic_base(query_count)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-reads-") as scratch:
        reference = reference_module(REFERENCE_COMMIT, Path(scratch))
        for size in sizes:
            folder = await snapshot_of(size, Path(scratch) / str(size), base, searching, queries)
            rows += [f"| {size:,} | {line} |" for line in compare(folder, reference, searching, queries, rounds)]
            print(*rows[-2:], sep="\n", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,100000")
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    rows = asyncio.run(measure([int(s) for s in args.sizes.split(",")], args.queries, args.rounds))
    print(
        "\n| chunks | index | same hits | CPU p50 ms | 8 vs 1 (GIL-free) | change p50 ms | change p95 ms |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + f"\n\n{os.cpu_count()} cores, load average "
        f"{load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end."
    )


if __name__ == "__main__":
    main()
