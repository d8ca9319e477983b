"""Hybrid index benchmark: HNSW recall and latency against exact search, and ingest rate against the embedder.

1. usearch recall@10 vs exact float32 search on 100k clustered synthetic 384-d unit vectors (1000 gaussian
   centres + noise; queries are held-out points drawn the same way), for f16 and i8, with the defaults of
   ragsidecar.knowledge.index; build rate and single-query p50/p95 latency (threads=1) next to numpy.
2. Ingest: chunks/s of the raw onnxruntime embedder (bge-small-en-v1.5, one text per run, every core) on the
   first 2000 SciFact abstracts, vs the same embedding followed by HybridIndex.build + save. The pipeline is
   sequential, so (b) is timed as the one embedding pass plus build + save of exactly its vectors.
   Also: HybridIndex.search p50/p95 over those chunks for SciFact queries (query embedding not included).

    .venv/bin/python bench/index.py [--vectors 100000] [--queries 1000] [--texts 2000]
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import tempfile
import time
from pathlib import Path

import ir_collections
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from ragsidecar.knowledge.index import (
    DEFAULT_CONNECTIVITY,
    DEFAULT_EXPANSION_ADD,
    DEFAULT_EXPANSION_SEARCH,
    HybridIndex,
    IndexedChunk,
    make_hnsw,
)

REPO = Path(__file__).resolve().parent.parent
MODEL_DIR = REPO / "models" / "bge-small-en-v1.5"
DIMENSIONS = 384
CENTRES = 1000
K = 10
RESCORE_DEPTH = 50
CPUS = os.cpu_count() or 1


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def clustered(count: int, queries: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Points around random centres with per-cluster spread: dense neighbourhoods of near-ties, unlike noise."""
    rng = np.random.default_rng(seed)
    centres = unit(rng.standard_normal((CENTRES, DIMENSIONS)))
    spread = rng.uniform(0.5, 1.2, CENTRES).astype(np.float32)  # noise norm relative to the unit centre

    def draw(n: int) -> np.ndarray:
        owner = rng.integers(0, CENTRES, n)
        noise = rng.standard_normal((n, DIMENSIONS)).astype(np.float32) / np.sqrt(DIMENSIONS)
        return unit(centres[owner] + noise * spread[owner, None])

    return draw(count), draw(queries)


def exact_top(data: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Brute-force top-k by cosine (dot of unit vectors), in blocks to bound memory."""
    out = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), 100):
        scores = queries[start : start + 100] @ data.T
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(scores, part, axis=1).argsort(axis=1)[:, ::-1]
        out[start : start + 100] = np.take_along_axis(part, order, axis=1)
    return out


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]))


def latencies_ms(search, queries: np.ndarray) -> tuple[float, float]:
    times = []
    for q in queries:
        start = time.perf_counter()
        search(q)
        times.append((time.perf_counter() - start) * 1000)
    return float(np.percentile(times, 50)), float(np.percentile(times, 95))


def exact_single(data: np.ndarray, q: np.ndarray) -> np.ndarray:
    scores = data @ q
    part = np.argpartition(-scores, K - 1)[:K]
    return part[np.argsort(-scores[part])]


def rescore(data: np.ndarray, queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    exact = np.einsum("qkd,qd->qk", data[keys.astype(np.int64)], queries)
    return np.take_along_axis(keys, np.argsort(-exact, axis=1)[:, :K], axis=1)


def bench_hnsw(count: int, n_queries: int) -> None:
    data, queries = clustered(count, n_queries)
    truth = exact_top(data, queries, K)
    print(f"\n## 1. HNSW vs exact: {count} clustered {DIMENSIONS}-d vectors, {n_queries} queries, recall@{K}")
    print(
        f"defaults: connectivity={DEFAULT_CONNECTIVITY} expansion_add={DEFAULT_EXPANSION_ADD} "
        f"expansion_search={DEFAULT_EXPANSION_SEARCH}; build threads={CPUS}, search threads=1"
    )
    print(
        f"{'method':8} {'build vec/s':>12} {'recall@10':>10} {'p50 ms':>8} {'p95 ms':>8} {'rescored':>9}   "
        f"recall at expansion_search"
    )
    sample = queries[: min(300, n_queries)]  # numpy brute force is slow; 300 single queries give stable percentiles
    p50, p95 = latencies_ms(lambda q: exact_single(data, q), sample)
    print(f"{'exact':8} {'-':>12} {1.0:>10.4f} {p50:>8.3f} {p95:>8.3f}")
    for dtype in ("f16", "i8"):
        hnsw = make_hnsw(DIMENSIONS, dtype)
        start = time.perf_counter()
        hnsw.add(np.arange(count, dtype=np.uint64), data, threads=CPUS)
        rate = count / (time.perf_counter() - start)
        found = hnsw.search(queries, K, threads=CPUS).keys
        rescored = recall(rescore(data, queries, hnsw.search(queries, RESCORE_DEPTH, threads=CPUS).keys), truth)
        p50, p95 = latencies_ms(functools.partial(hnsw.search, count=K, threads=1), queries)
        sweep = []
        for ef in (16, 32, 128, 256):  # the tradeoff around the default, for whoever retunes it
            hnsw.expansion_search = ef
            sweep.append(f"{ef}:{recall(hnsw.search(queries, K, threads=CPUS).keys, truth):.4f}")
        print(
            f"{dtype:8} {rate:>12,.0f} {recall(found, truth):>10.4f} {p50:>8.3f} {p95:>8.3f} {rescored:>9.4f}   "
            f"{' '.join(sweep)}"
        )
    print(
        f"rescored: top-{RESCORE_DEPTH} HNSW candidates re-ranked by exact float32 cosine, then top-{K} "
        f"(what HybridIndex.search does with candidates={RESCORE_DEPTH})"
    )


class Embedder:
    """bge-small-en-v1.5 as the sidecar runs it: one unpadded text per run, CLS vector, normalised."""

    def __init__(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = CPUS
        self.session = ort.InferenceSession(str(MODEL_DIR / "model.onnx"), options)
        self.tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.tokenizer.enable_truncation(512)

    def embed(self, text: str) -> np.ndarray:
        e = self.tokenizer.encode(text)
        feed = {
            "input_ids": np.array([e.ids], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids], dtype=np.int64),
        }
        cls = self.session.run(None, feed)[0][0, 0]
        return cls / np.linalg.norm(cls)


def scifact(count: int) -> list[tuple[str, str]]:
    docs = []
    with gzip.open(ir_collections.folder("scifact") / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            docs.append((record["_id"], f"{record['title']} {record['text']}".strip()))
            if len(docs) == count:
                break
    return docs


def scifact_queries(count: int) -> list[str]:
    with open(ir_collections.folder("scifact") / "queries.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f][:count]


def bench_ingest(count: int) -> None:
    docs = scifact(count)
    embedder = Embedder()
    embedder.embed("warm up")
    start = time.perf_counter()
    vectors = np.stack([embedder.embed(text) for _, text in docs]).astype(np.float32)
    embed_s = time.perf_counter() - start
    chunks = [IndexedChunk(doc_id, text, {"source": "scifact", "position": i}) for i, (doc_id, text) in enumerate(docs)]
    start = time.perf_counter()
    index = HybridIndex.build(chunks, vectors, threads=CPUS)
    build_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        index.save(Path(folder) / "index")
        save_s = time.perf_counter() - start
        start = time.perf_counter()
        HybridIndex.load(Path(folder) / "index")
        load_s = time.perf_counter() - start
    total = embed_s + build_s + save_s
    print(
        f"\n## 2. Ingest: first {count} SciFact abstracts (title + text), bge-small-en-v1.5, "
        f"one text per run, intra_op_threads={CPUS}"
    )
    print(f"{'pipeline':34} {'seconds':>8} {'chunks/s':>9} {'vs raw':>7}")
    print(f"{'(a) raw onnxruntime embed':34} {embed_s:>8.2f} {count / embed_s:>9.1f} {1.0:>7.3f}")
    print(f"{'(b) embed + build + save':34} {total:>8.2f} {count / total:>9.1f} {embed_s / total:>7.3f}")
    print(
        f"    of which build {build_s:.3f} s (HNSW f16 + BM25), save {save_s:.3f} s; "
        f"indexing overhead {100 * (build_s + save_s) / embed_s:.1f}% of embedding time; load {load_s:.3f} s"
    )
    bench_hybrid_search(embedder, index)


def bench_hybrid_search(embedder: Embedder, index: HybridIndex) -> None:
    queries = scifact_queries(200)
    embedded = [(embedder.embed(q), q) for q in queries]
    times = []
    for vector, text in embedded:
        start = time.perf_counter()
        index.search(vector, text, k=10, candidates=50)
        times.append((time.perf_counter() - start) * 1000)
    print(
        f"    HybridIndex.search over {len(index)} chunks, {len(queries)} SciFact queries, k=10 candidates=50: "
        f"p50 {np.percentile(times, 50):.3f} ms, p95 {np.percentile(times, 95):.3f} ms (query embedding excluded)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--texts", type=int, default=300)
    args = parser.parse_args()
    started = time.perf_counter()
    bench_hnsw(args.vectors, args.queries)
    bench_ingest(args.texts)
    print(f"\n(total {time.perf_counter() - started:.0f} s on {CPUS} cores)")


if __name__ == "__main__":
    main()
