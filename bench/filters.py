"""Filtered search benchmark: one MEMORY partition's index (HybridIndex) of 100k chunks, filters keeping 0.1%,
1%, 10% and 50% of them, side by side with the unfiltered search in one run.

Chunks: clustered synthetic 384-d unit vectors (bench/index.py's generator: 1000 gaussian centres + noise) and
texts of 12 words drawn from a Zipf vocabulary of 5,000 (so BM25 has real postings); each chunk's document
carries typed metadata drawn at random, independent of the vectors: `bucket` (number 0..999), `tag` (one of 10
strings), `flag` (boolean). Filters (one kind of leaf each): bucket == 7 (0.1%), bucket < 10 (1%),
tag in ["t3"] (10%), flag == true (50%); and bucket < 20 (2%), bucket >= 950 (5%) to place the switch point.

Reported per selectivity:
- recall@10 of the dense list (RETRIEVAL_MODE_DENSE) against exact filtered search (float32 cosine over every
  chunk the filter keeps), the approximate part of a filtered search;
- recall@10 of the hybrid hits against the hybrid search with the exact filtered dense list;
- p50 of the hybrid search (dense + BM25, what a SEARCH entry runs) filtered, next to the unfiltered one, and
  their ratio; and the p50 of each dense strategy forced (the exact scan of the selection, the graph asked for
  more neighbours until enough pass), which is what index.EXACT_SELECTION, the switch point, is chosen by.

    .venv/bin/python bench/filters.py [--chunks 100000] [--queries 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ragsidecar.knowledge import filters as f
from ragsidecar.knowledge import index as index_module
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk

DIMENSIONS = 384
CENTRES = 1000
VOCABULARY = 5000
WORDS = 12
K = 10

FILTERS: list[tuple[str, f.Filter]] = [
    ("0.1%  bucket == 7", f.Compare("bucket", f.Op.EQUAL, 7.0)),
    ("1%    bucket < 10", f.Compare("bucket", f.Op.LESS, 10.0)),
    ("2%    bucket < 20", f.Compare("bucket", f.Op.LESS, 20.0)),
    ("5%    bucket >= 950", f.Compare("bucket", f.Op.GREATER_OR_EQUAL, 950.0)),
    ("10%   tag in [t3]", f.In("tag", ("t3",))),
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


def p50_ms(search, queries: np.ndarray, words: list[str]) -> float:
    times = []
    for q, w in zip(queries, words, strict=True):
        start = time.perf_counter()
        search(q, w)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


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
        f"built {args.chunks} chunks in {time.perf_counter() - started:.1f}s;"
        f" exact scan up to {index_module.EXACT_SELECTION} chunks"
    )
    ids = {c.id: i for i, c in enumerate(items)}

    def hybrid(keep: f.Filter | None):
        return lambda q, w: index.search(q, w, K, keep=keep)

    index.search(queries[0], query_words[0], K, keep=FILTERS[0][1])  # builds the field index (once per index)
    unfiltered = p50_ms(hybrid(None), queries, query_words)
    print(f"unfiltered hybrid p50 {unfiltered:.2f} ms")
    print(
        f"{'filter':22} {'kept':>7} {'dense recall@10':>16} {'hybrid recall@10':>17} {'p50 ms':>8} {'x unfiltered':>13}"
        f" {'exact scan ms':>14} {'graph ms':>9} {'graph recall':>13}"
    )
    exact_switch = index_module.EXACT_SELECTION
    for name, keep in FILTERS:
        fields = [c.meta["fields"] for c in items]
        kept = np.array([i for i, fl in enumerate(fields) if f.matches(keep, f.from_json(fl))])
        dense_recall, hybrid_recall = [], []
        for q, w in zip(queries, query_words, strict=True):
            found = {ids[h.chunk.id] for h in index.search(q, w, K, use_lexical=False, keep=keep)}
            truth = exact_filtered(vectors, kept, q)
            dense_recall.append(len(found & truth) / max(1, len(truth)))
            approximate = [h.chunk.id for h in index.search(q, w, K, keep=keep)]
            index_module.EXACT_SELECTION = args.chunks  # the same search with the exact filtered dense list
            exact = [h.chunk.id for h in index.search(q, w, K, keep=keep)]
            index_module.EXACT_SELECTION = exact_switch
            hybrid_recall.append(len(set(approximate) & set(exact)) / max(1, len(exact)))
        p50 = p50_ms(hybrid(keep), queries, query_words)
        index_module.EXACT_SELECTION = args.chunks
        scan = p50_ms(hybrid(keep), queries, query_words)
        index_module.EXACT_SELECTION = 0
        graph = p50_ms(hybrid(keep), queries, query_words)
        graph_recall = statistics.mean(
            len(
                {ids[h.chunk.id] for h in index.search(q, w, K, use_lexical=False, keep=keep)}
                & exact_filtered(vectors, kept, q)
            )
            / K
            for q, w in zip(queries, query_words, strict=True)
        )
        index_module.EXACT_SELECTION = exact_switch
        print(
            f"{name:22} {len(kept):>7} {statistics.mean(dense_recall):>16.3f} {statistics.mean(hybrid_recall):>17.3f}"
            f" {p50:>8.2f} {p50 / unfiltered:>12.2f}x {scan:>14.2f} {graph:>9.2f} {graph_recall:>13.3f}"
        )


if __name__ == "__main__":
    main()
