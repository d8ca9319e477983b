"""Filtered search benchmark: one MEMORY partition's index (HybridIndex) of 100k chunks, filters keeping 0.1%,
1%, 10% and 50% of them, side by side with the unfiltered search in one run.

Chunks: clustered synthetic 384-d unit vectors (bench/index.py's generator: 1000 gaussian centres + noise) and
texts of 12 words drawn from a Zipf vocabulary of 5,000 (so BM25 has real postings); each chunk's document
carries typed metadata drawn at random, independent of the vectors: `bucket` (number 0..999), `tag` (one of 10
strings), `flag` (boolean). Filters (one kind of leaf each): bucket == 7 (0.1%), bucket < 10 (1%),
tag in ["t3"] (10%), flag == true (50%); and bucket < 20 (2%), bucket >= 950 (5%), bucket < 200 (20%) and
bucket < 300 (30%) to place the switch point.

Reported per selectivity:
- recall@10 of the dense list (RETRIEVAL_MODE_DENSE) against exact filtered search (float32 cosine over every
  chunk the filter keeps), the approximate part of a filtered search;
- recall@10 of the hybrid hits against the hybrid search with the exact filtered dense list;
- p50 of the hybrid search (dense + BM25, each list 100 candidates deep as the server searches) filtered, next
  to the unfiltered one timed query by query beside it, and their ratio; and the p50 of each dense strategy
  forced (the exact scan of the selection, the graph asked for more neighbours until enough pass), which is what
  index.EXACT_ROWS_PER_NEIGHBOUR, the switch point, is chosen by.

    .venv/bin/python bench/filters.py [--chunks 100000] [--queries 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ragsidecar.knowledge import filters as f
from ragsidecar.knowledge import index as index_module
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk

DIMENSIONS = 384
CENTRES = 1000
VOCABULARY = 5000
WORDS = 12
K = 10
CANDIDATES = 100  # each list's depth, as the server searches ([retrieval] fusion_candidates)

Search = Callable[[np.ndarray, str], None]
ALWAYS_SCAN = 1 << 40  # selected chunks per graph neighbour: no selection is that large

FILTERS: list[tuple[str, f.Filter]] = [
    ("0.1%  bucket == 7", f.Compare("bucket", f.Op.EQUAL, 7.0)),
    ("1%    bucket < 10", f.Compare("bucket", f.Op.LESS, 10.0)),
    ("2%    bucket < 20", f.Compare("bucket", f.Op.LESS, 20.0)),
    ("5%    bucket >= 950", f.Compare("bucket", f.Op.GREATER_OR_EQUAL, 950.0)),
    ("10%   tag in [t3]", f.In("tag", ("t3",))),
    ("20%   bucket < 200", f.Compare("bucket", f.Op.LESS, 200.0)),
    ("30%   bucket < 300", f.Compare("bucket", f.Op.LESS, 300.0)),
    ("50%   flag == true", f.Compare("flag", f.Op.EQUAL, True)),
]


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def clustered(count: int, queries: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    centres = unit(rng.standard_normal((CENTRES, DIMENSIONS)))
    spread = rng.uniform(0.5, 1.2, CENTRES).astype(np.float32)

    def draw(n: int) -> np.ndarray:
        owner = rng.integers(0, CENTRES, n)
        noise = rng.standard_normal((n, DIMENSIONS)).astype(np.float32) / np.sqrt(DIMENSIONS)
        return unit(centres[owner] + spread[owner, None] * noise)

    return draw(count), draw(queries)


def texts(count: int, rng: np.random.Generator) -> list[str]:
    ranks = np.minimum(rng.zipf(1.2, (count, WORDS)), VOCABULARY) - 1
    return [" ".join(f"w{r}" for r in row) for row in ranks]


def chunks(count: int, rng: np.random.Generator) -> list[IndexedChunk]:
    bodies = texts(count, rng)
    buckets, tags, flags = rng.integers(0, 1000, count), rng.integers(0, 10, count), rng.random(count) < 0.5
    return [
        IndexedChunk(
            f"c{i}",
            bodies[i],
            {
                "document_id": f"d{i}",
                "fields": {"bucket": float(buckets[i]), "tag": f"t{tags[i]}", "flag": bool(flags[i])},
            },
        )
        for i in range(count)
    ]


def exact_filtered(vectors: np.ndarray, kept: np.ndarray, query: np.ndarray) -> set[int]:
    scores = vectors[kept] @ query
    return set(kept[np.argsort(-scores, kind="stable")[:K]].tolist())


@contextmanager
def switched(rows_per_neighbour: int) -> Iterator[None]:
    """Filtered searches with the dense strategy's switch point at `rows_per_neighbour` (ALWAYS_SCAN: the exact scan
    of the selection; 0: the graph)."""
    chosen = index_module.EXACT_ROWS_PER_NEIGHBOUR
    index_module.EXACT_ROWS_PER_NEIGHBOUR = rows_per_neighbour
    try:
        yield
    finally:
        index_module.EXACT_ROWS_PER_NEIGHBOUR = chosen


def p50s_ms(searches: dict[str, Search], queries: np.ndarray, words: list[str]) -> dict[str, float]:
    """Each search's p50, the searches taken in turn query by query: a shared machine's load changes by the second,
    and timing one search after the other would put it in some columns only."""
    times: dict[str, list[float]] = {name: [] for name in searches}
    for q, w in zip(queries, words, strict=True):
        for name, search in searches.items():
            start = time.perf_counter()
            search(q, w)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(spent) * 1000 for name, spent in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(31)
    vectors, queries = clustered(args.chunks, args.queries, rng)
    items = chunks(args.chunks, rng)
    query_words = [
        " ".join(f"w{r}" for r in row) for row in np.minimum(rng.zipf(1.2, (args.queries, 3)), VOCABULARY) - 1
    ]
    started = time.perf_counter()
    index = HybridIndex.build(items, vectors, threads=2)
    print(
        f"built {args.chunks} chunks in {time.perf_counter() - started:.1f}s; the exact scan while a selected chunk"
        f" costs at most 1/{index_module.EXACT_ROWS_PER_NEIGHBOUR} of a graph neighbour"
    )
    ids = {c.id: i for i, c in enumerate(items)}

    def dense_ids(q: np.ndarray, w: str, keep: f.Filter) -> set[int]:
        return {ids[h.chunk.id] for h in index.search(q, w, K, CANDIDATES, use_lexical=False, keep=keep)}

    def hybrid(keep: f.Filter | None, rows_per_neighbour: int | None = None) -> Search:
        def search(q: np.ndarray, w: str) -> None:
            with switched(index_module.EXACT_ROWS_PER_NEIGHBOUR if rows_per_neighbour is None else rows_per_neighbour):
                index.search(q, w, K, CANDIDATES, keep=keep)

        return search

    index.search(
        queries[0], query_words[0], K, CANDIDATES, keep=FILTERS[0][1]
    )  # builds the field index (once per index)
    print(
        f"{'filter':22} {'kept':>7} {'dense recall@10':>16} {'hybrid recall@10':>17} {'p50 ms':>8}"
        f" {'unfiltered ms':>14} {'x unfiltered':>13} {'exact scan ms':>14} {'graph ms':>9} {'graph recall':>13}"
    )
    fields = [f.from_json(c.meta["fields"]) for c in items]
    for name, keep in FILTERS:
        kept = np.array([i for i, fl in enumerate(fields) if f.matches(keep, fl)])
        dense_recall, hybrid_recall, graph_recall = [], [], []
        for q, w in zip(queries, query_words, strict=True):
            truth = exact_filtered(vectors, kept, q)
            dense_recall.append(len(dense_ids(q, w, keep) & truth) / max(1, len(truth)))
            approximate = [h.chunk.id for h in index.search(q, w, K, CANDIDATES, keep=keep)]
            with switched(ALWAYS_SCAN):  # the same search with the exact filtered dense list
                exact = [h.chunk.id for h in index.search(q, w, K, CANDIDATES, keep=keep)]
            hybrid_recall.append(len(set(approximate) & set(exact)) / max(1, len(exact)))
            with switched(0):
                graph_recall.append(len(dense_ids(q, w, keep) & truth) / max(1, len(truth)))
        p50 = p50s_ms(
            {
                "chosen": hybrid(keep),
                "unfiltered": hybrid(None),
                "scan": hybrid(keep, ALWAYS_SCAN),
                "graph": hybrid(keep, 0),
            },
            queries,
            query_words,
        )
        print(
            f"{name:22} {len(kept):>7} {statistics.mean(dense_recall):>16.3f} {statistics.mean(hybrid_recall):>17.3f}"
            f" {p50['chosen']:>8.2f} {p50['unfiltered']:>14.2f} {p50['chosen'] / p50['unfiltered']:>12.2f}x"
            f" {p50['scan']:>14.2f} {p50['graph']:>9.2f} {statistics.mean(graph_recall):>13.3f}"
        )


if __name__ == "__main__":
    main()
