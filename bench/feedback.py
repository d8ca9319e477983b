"""What pseudo-relevance feedback costs a hybrid search: HybridIndex.search with the configured fusion, feedback
on (config/ragsidecar.toml's retrieval.feedback_documents / feedback_weight) and off, on one index, the two
interleaved query by query (each round in the other order), so both see the same machine. Its quality is
bench/beir.py's to measure.

The index: --chunks synthetic chunks, 384-d unit vectors (random directions) and 60 words each from a
5,000-word vocabulary; queries of 4 words with their own random vector; k 10 over retrieval.fusion_candidates.

    .venv/bin/python bench/feedback.py [--chunks 20000] [--queries 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import time
from pathlib import Path

import numpy as np

from ragsidecar.config_loading import load_config
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk
from ragsidecar.knowledge.ranking import fusion_settings

REPO = Path(__file__).resolve().parent.parent
DIMENSIONS = 384
VOCABULARY = [f"w{i}" for i in range(5000)]


def synthetic_index(chunks: int, rng: np.random.Generator, words: random.Random, retrieval) -> HybridIndex:
    texts = [" ".join(words.choices(VOCABULARY, k=60)) for _ in range(chunks)]
    vectors = rng.standard_normal((chunks, DIMENSIONS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return HybridIndex.build(
        [IndexedChunk(f"c{i}", text, {}) for i, text in enumerate(texts)],
        vectors,
        threads=retrieval.index_threads,
        dtype=retrieval.index_dtype,
        lexical_language=retrieval.lexical_language,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    retrieval = load_config(REPO / "config" / "ragsidecar.toml").retrieval
    on = fusion_settings(retrieval)
    if not on.feedback:
        raise SystemExit("feedback is off in config/ragsidecar.toml: nothing to compare")
    off = dataclasses.replace(on, feedback_documents=0)
    rng, words = np.random.default_rng(0), random.Random(0)
    started = time.perf_counter()
    index = synthetic_index(args.chunks, rng, words, retrieval)
    print(f"{args.chunks} chunks indexed in {time.perf_counter() - started:.0f} s", flush=True)
    queries = [
        (rng.standard_normal(DIMENSIONS).astype(np.float32), " ".join(words.choices(VOCABULARY, k=4)))
        for _ in range(args.queries)
    ]
    times: dict[str, list[float]] = {"off": [], "on": []}
    for round_ in range(args.rounds):
        order = [("off", off), ("on", on)] if round_ % 2 == 0 else [("on", on), ("off", off)]
        for vector, text in queries:
            for name, fusion in order:
                begun = time.perf_counter()
                index.search(vector, text, 10, retrieval.fusion_candidates, fusion=fusion)
                times[name].append(time.perf_counter() - begun)
    print(
        f"\nHybridIndex.search, k 10, {retrieval.fusion_candidates} candidates, {retrieval.fusion} fusion, "
        f"{args.chunks} chunks, {args.queries} queries x {args.rounds} rounds interleaved; "
        f"load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| feedback | p50 ms | p95 ms |\n|---|---|---|")
    for name, label in (("off", "off"), ("on", f"{on.feedback_documents} x {on.feedback_weight:g}")):
        spent = sorted(times[name])
        print(f"| {label} | {statistics.median(spent) * 1e3:.2f} | {spent[int(0.95 * len(spent))] * 1e3:.2f} |")
    print(f"\np50 on / off: {statistics.median(times['on']) / statistics.median(times['off']):.2f}x")


if __name__ == "__main__":
    main()
