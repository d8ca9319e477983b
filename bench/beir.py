"""Retrieval quality on real IR collections (BEIR layout, ../shared/data/ir), through the product's own code.

Four modes per collection, nDCG@10 (graded gains, log2 discount) and Recall@100 (rel > 0), next to the
published baselines from ../shared/data/ir/README.md:
  BM25            HybridIndex's lexical side (bm25s, English stopwords, no stemmer), top 100
  dense           HybridIndex's dense side (usearch HNSW, exact float32 re-scoring), top 100
  hybrid          HybridIndex.search: RRF (k=60) of the dense and BM25 top-100 lists
  hybrid+rerank   what Enforce does for a SEARCH entry with rerank: HybridIndex.search(k=N,
                  candidates=max(fusion_candidates, N)), then the sidecar's Rerank RPC over gRPC
                  (ms-marco-MiniLM-L-12-v2) scores those N, and the reranker's order is fused with the
                  retrieval order by RRF (as knowledge/runtime.py ranks); ranks N+1..100 come from the hybrid
                  list. "reranker order" (the N in the reranker's order alone) is shown for comparison.

Embeddings: bge-small-en-v1.5 loaded in-process with the product's model code (ragsidecar.inference.models,
the same BiEncoder the sidecar uses; the sidecar has no raw embedding RPC). One vector per document
("title text", cut at 512 tokens, no chunking, as BEIR does); queries carry retrieval.query_prefix.
Document vectors are cached under bench/results/ keyed by set and model file, so a second run skips that.
The quality pass reranks with --clients concurrent callers (both inference workers busy). Then
--latency-queries SciFact queries run one at a time, each timed as Enforce spends it (embed the query,
hybrid search, Rerank RPC): their p50/p95 is the Enforce latency figure. CPU seconds are printed beside wall
times because the machine may be shared.

    .venv/bin/python bench/beir.py [--sets scifact,cranfield,med] [--rerank-depth 20] [--clients 4]
                                   [--latency-queries 50]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import csv
import dataclasses
import gzip
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import ir_collections  # noqa: E402
from sidecar import Sidecar, default_config  # noqa: E402

from ragsidecar.config import load_config  # noqa: E402
from ragsidecar.inference.models import load_model  # noqa: E402
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk, reciprocal_rank_fusion  # noqa: E402
from ragsidecar.v1 import reranker_pb2  # noqa: E402

RESULTS = REPO / "bench" / "results"
RERANKER = "ms-marco-MiniLM-L-12-v2"
DEPTH = 100  # Recall@100 needs 100 results per mode
EMBED_BATCH = 64  # texts per BiEncoder.embed call (its outputs are [tokens, 384] per text until pooled)
CACHE_FORMAT = "v1-title-space-text"
TARGET = ("scifact", "hybrid+rerank", 0.70)

# Published nDCG@10 (and R@100 where given) from ../shared/data/ir/README.md, per set and mode.
BASELINES = {
    "scifact": {"BM25": "BEIR BM25 0.665; Anserini BM25 0.679 (R@100 0.925)",
                "hybrid+rerank": "BEIR BM25 + CE rerank top-100: 0.688"},
    "cranfield": {"BM25": "bm25s (k1 0.9, b 0.4, stemmed): 0.352"},
    "med": {"BM25": "bm25s: 0.671"},
}
MODES = ("BM25", "dense", "hybrid", "reranker order", "hybrid+rerank")


# ---- data ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Collection:
    name: str
    doc_ids: list[str]
    doc_texts: list[str]
    queries: dict[str, str]  # judged test queries only
    qrels: dict[str, dict[str, int]]


def read_collection(name: str) -> Collection:
    folder = ir_collections.folder(name)
    with gzip.open(folder / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    ids = [r["_id"] for r in rows]
    texts = [" ".join(filter(None, ((r.get("title") or "").strip(), (r.get("text") or "").strip()))) for r in rows]
    qrels: dict[str, dict[str, int]] = {}
    with (folder / "qrels" / "test.tsv").open(encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    with (folder / "queries.jsonl").open(encoding="utf-8") as f:
        all_queries = {r["_id"]: r["text"] for r in map(json.loads, f)}
    queries = {q: all_queries[q] for q in sorted(qrels, key=_natural) if q in all_queries}
    return Collection(name, ids, texts, queries, qrels)


def _natural(key: str):
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


# ---- metrics ---------------------------------------------------------------------------------------------

def ndcg_at(ranking: list[str], judged: dict[str, int], k: int = 10) -> float:
    dcg = sum(judged.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:k]))
    ideal = sorted((r for r in judged.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranking: list[str], judged: dict[str, int], k: int = 100) -> float:
    relevant = {d for d, r in judged.items() if r > 0}
    return len(relevant.intersection(ranking[:k])) / len(relevant)


def evaluate(runs: dict[str, list[str]], qrels: dict[str, dict[str, int]]) -> tuple[float, float, int]:
    """Mean nDCG@10 and Recall@100 over queries with at least one relevant (rel > 0) judgment."""
    scored = [q for q in runs if any(r > 0 for r in qrels[q].values())]
    return (statistics.fmean(ndcg_at(runs[q], qrels[q]) for q in scored),
            statistics.fmean(recall_at(runs[q], qrels[q]) for q in scored), len(scored))


# ---- the product's embedder, in-process -------------------------------------------------------------------

class Embedder:
    """bge-small-en-v1.5 as the sidecar loads it (load_model + BiEncoder.embed), on its own event loop."""

    def __init__(self, config) -> None:
        self.config = config
        self.spec = next(m for m in config.models if m.id == config.retrieval.embedder)
        self.folder = config.model_dir(self.spec)
        inference = dataclasses.replace(config.inference, workers=2, intra_op_threads=1, inter_op_threads=1)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.model = self._run(load_model(self.spec, self.folder, inference))

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        """Unit vectors, batched EMBED_BATCH texts a call with two calls in flight; and how many were cut."""

        async def all_batches() -> list:
            gate = asyncio.Semaphore(2)

            async def one(batch: list[str]):
                async with gate:
                    return await self.model.embed(batch)

            return await asyncio.gather(*(one(texts[i : i + EMBED_BATCH]) for i in range(0, len(texts), EMBED_BATCH)))

        results = self._run(all_batches())
        return np.concatenate([r[0] for r in results]), sum(sum(r[1]) for r in results)

    def query(self, text: str) -> np.ndarray:
        vectors, *_ = self._run(self.model.embed([self.config.retrieval.query_prefix + text]))
        return vectors[0]

    def cache_key(self) -> str:
        model_file = self.folder / "model.onnx"
        digest = hashlib.sha256()
        with open(model_file, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        return (f"{self.spec.id}-{digest.hexdigest()[:12]}-{model_file.stat().st_size}-"
                f"L{self.spec.max_length}-{self.spec.pooling}-{CACHE_FORMAT}")

    def close(self) -> None:
        self._run(self.model.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


# ---- one collection --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Prepared:
    data: Collection
    index: HybridIndex
    query_vectors: dict[str, np.ndarray]
    runs: dict[str, dict[str, list[str]]]  # mode -> query -> ranked doc ids
    enforce_hits: dict[str, list[IndexedChunk]]  # query -> the N fused candidates Enforce would rerank
    timings: dict[str, str]


def prepare(name: str, embedder: Embedder, key: str, depth: int, fusion_candidates: int) -> Prepared:
    config = embedder.config
    data = read_collection(name)
    timings: dict[str, str] = {}
    cache = RESULTS / f"{name}-{key}.npy"
    started = time.perf_counter()
    vectors = np.load(cache) if cache.is_file() else None
    if vectors is not None and vectors.shape[0] == len(data.doc_ids):
        timings["embed docs"] = f"cached ({len(data.doc_ids)} docs)"
    else:
        cpu = time.process_time()
        vectors, cut = embedder.embed(data.doc_texts)
        cpu = time.process_time() - cpu
        np.save(cache, vectors)
        spent = time.perf_counter() - started
        timings["embed docs"] = (f"{spent:.1f} s ({len(data.doc_ids) / spent:.1f} docs/s, {cpu:.0f} CPU s, "
                                 f"{cut} cut at 512 tokens)")
    print(f"  [{name}] embed docs: {timings['embed docs']}", flush=True)

    started = time.perf_counter()
    query_vectors = {q: embedder.query(t) for q, t in data.queries.items()}
    spent = time.perf_counter() - started
    timings["embed queries"] = f"{spent:.1f} s ({1000 * spent / len(query_vectors):.1f} ms/query, one at a time)"

    started = time.perf_counter()
    chunks = [IndexedChunk(i, t, {}) for i, t in zip(data.doc_ids, data.doc_texts)]
    index = HybridIndex.build(chunks, vectors, threads=config.retrieval.index_threads,
                              dtype=config.retrieval.index_dtype)
    timings["index build"] = f"{time.perf_counter() - started:.1f} s ({config.retrieval.index_dtype} HNSW + BM25)"

    # BM25-only and dense-only use the same two candidate generators HybridIndex.search fuses (its lexical
    # side and its HNSW search with exact re-scoring); they are private helpers, called here as search does.
    runs: dict[str, dict[str, list[str]]] = {m: {} for m in MODES}
    enforce_hits: dict[str, list[IndexedChunk]] = {}
    ids = data.doc_ids
    started = time.perf_counter()
    for q, text in data.queries.items():
        vector = query_vectors[q]
        runs["BM25"][q] = [ids[p] for p, _ in index._lexical.top(text, DEPTH)]
        runs["dense"][q] = [ids[p] for p, _ in index._dense_top(index._unit_query(vector), DEPTH)]
        runs["hybrid"][q] = [h.chunk.id for h in index.search(vector, text, DEPTH, candidates=DEPTH)]
        # Enforce's call for a SEARCH entry with rerank (knowledge/runtime.py): k = N, candidates >= fusion.
        enforce_hits[q] = [h.chunk for h in index.search(vector, text, depth, max(fusion_candidates, depth))]
    spent = time.perf_counter() - started
    timings["search"] = f"{spent:.2f} s ({1000 * spent / len(data.queries):.2f} ms/query for 4 searches)"
    print(f"  [{name}] queries {timings['embed queries']}; index {timings['index build']}; "
          f"search {timings['search']}", flush=True)
    return Prepared(data, index, query_vectors, runs, enforce_hits, timings)


def rerank_call(stub, query: str, hits: list[IndexedChunk]) -> list[str]:
    documents = [reranker_pb2.RerankDocument(id=c.id, text=c.text) for c in hits]
    response = stub.Rerank(reranker_pb2.RerankRequest(model=RERANKER, query=query, documents=documents), timeout=300)
    return [r.id for r in response.results]


def with_tail(reranked: list[str], hybrid: list[str]) -> list[str]:
    seen = set(reranked)
    return reranked + [d for d in hybrid if d not in seen]


def server_cpu(server: Sidecar) -> float:
    times = psutil.Process(server.process.pid).cpu_times()
    return times.user + times.system


def rerank_concurrent(server: Sidecar, stub, prepared: Prepared, clients: int) -> None:
    data = prepared.data
    cpu = server_cpu(server)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        orders = dict(zip(data.queries, pool.map(
            lambda q: rerank_call(stub, data.queries[q], prepared.enforce_hits[q]), data.queries)))
    spent = time.perf_counter() - started
    pairs = sum(len(h) for h in prepared.enforce_hits.values())
    # What Enforce ranks by (knowledge/runtime.py): the reranker's order fused with the retrieval order.
    prepared.runs["hybrid+rerank"] = {
        q: with_tail(sorted(fused := reciprocal_rank_fusion([orders[q], [c.id for c in prepared.enforce_hits[q]]]),
                            key=lambda d: -fused[d]), prepared.runs["hybrid"][q])
        for q in data.queries}
    # For comparison: the reranker's order alone.
    prepared.runs["reranker order"] = {q: with_tail(orders[q], prepared.runs["hybrid"][q]) for q in data.queries}
    cpu = server_cpu(server) - cpu
    prepared.timings["rerank"] = (f"{spent:.1f} s ({pairs / spent:.1f} pairs/s, {clients} clients; "
                                  f"sidecar {cpu:.0f} CPU s)")
    print(f"  [{data.name}] rerank {prepared.timings['rerank']}", flush=True)


def enforce_latency(embedder: Embedder, stub, prepared: Prepared, depth: int, fusion_candidates: int,
                    count: int) -> list[float]:
    """Seconds per query, one caller, as Enforce spends them: embed the query, hybrid search, Rerank RPC.

    `count` SciFact queries spread evenly over the set. The sidecar's result cache is off, so pairs
    already scored by the quality pass are scored again."""
    queries = list(prepared.data.queries.items())
    chosen = [queries[round(i * (len(queries) - 1) / max(count - 1, 1))] for i in range(min(count, len(queries)))]
    latencies: list[float] = []
    for _, text in chosen:
        started = time.perf_counter()
        vector = embedder.query(text)
        hits = [h.chunk for h in prepared.index.search(vector, text, depth, max(fusion_candidates, depth))]
        rerank_call(stub, text, hits)
        latencies.append(time.perf_counter() - started)
    return latencies


# ---- report ----------------------------------------------------------------------------------------------

def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def report(prepared: list[Prepared], depth: int, latencies: list[float] | None, clients: int, load: str) -> str:
    lines = [f"## BEIR-style retrieval quality (rerank depth {depth}, {os.cpu_count()} cores, 1-min load average {load})", "",
             "| set | queries | mode | nDCG@10 | R@100 | published (nDCG@10) |", "|---|---|---|---|---|---|"]
    verdict = ""
    for p in prepared:
        for mode in MODES:
            label = {"hybrid+rerank": f"hybrid + rerank {depth} (RRF with retrieval order)",
                     "reranker order": f"reranker order of top {depth}"}.get(mode, mode)
            ndcg, recall, count = evaluate(p.runs[mode], p.data.qrels)
            lines.append(f"| {p.data.name} | {count} | {label} | {ndcg:.3f} | {recall:.3f} | "
                         f"{BASELINES.get(p.data.name, {}).get(mode, '')} |")
            if (p.data.name, mode) == TARGET[:2]:
                verdict = (f"**{'PASS' if ndcg >= TARGET[2] else 'FAIL'}**: SciFact hybrid + rerank {depth} "
                           f"nDCG@10 {ndcg:.3f} (target >= {TARGET[2]:.2f})")
    lines += ["", "| set | docs | embed docs | embed queries | index build | search | rerank |",
              "|---|---|---|---|---|---|---|"]
    for p in prepared:
        t = p.timings
        lines.append(f"| {p.data.name} | {len(p.data.doc_ids)} | {t['embed docs']} | {t['embed queries']} | "
                     f"{t['index build']} | {t['search']} | {t.get('rerank', '')} |")
    if latencies:
        lines += ["", f"Enforce-like latency, SciFact, hybrid + rerank {depth} (embed query + search + Rerank RPC, "
                      f"one caller, {len(latencies)} queries): p50 {1000 * statistics.median(latencies):.0f} ms, "
                      f"p95 {1000 * percentile(latencies, 0.95):.0f} ms"]
    if verdict:
        lines += ["", verdict]
    lines += ["", "BM25 is the product's lexical side (bm25s defaults k1 1.5, b 0.75; English stopwords, no stemmer); "
              "hybrid = RRF(k=60) of dense and BM25 top-100; hybrid + rerank reranks Enforce's fused top-N "
              f"(candidates max(fusion_candidates, N)) with {RERANKER} through the sidecar ({clients} concurrent "
              "clients, result cache off) and fuses the reranker's order with the retrieval order by RRF, as Enforce "
              "ranks; the hybrid list follows the top N."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="scifact,cranfield,med")
    parser.add_argument("--rerank-depth", type=int, default=20, help="fused candidates reranked per query")
    parser.add_argument("--clients", type=int, default=4, help="concurrent Rerank callers in the quality pass")
    parser.add_argument("--latency-queries", type=int, default=50,
                        help="SciFact queries timed one at a time, Enforce-like (0: skip)")
    args = parser.parse_args()
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    RESULTS.mkdir(parents=True, exist_ok=True)
    config = load_config(REPO / "config" / "ragsidecar.toml", environ={})
    fusion = config.retrieval.fusion_candidates
    overall = time.perf_counter()
    load_start = os.getloadavg()[0]

    started = time.perf_counter()
    embedder = Embedder(config)
    key = embedder.cache_key()
    print(f"embedder {embedder.spec.id} loaded in {time.perf_counter() - started:.1f} s; cache key {key}", flush=True)
    latencies: list[float] | None = None
    try:
        prepared = [prepare(name, embedder, key, args.rerank_depth, fusion) for name in sets]
        with tempfile.TemporaryDirectory() as tmp:
            sidecar_config = default_config()
            sidecar_config["inference"].update(workers=2, intra_op_threads=1, cache_bytes=0)
            started = time.perf_counter()
            server = Sidecar(Path(tmp), sidecar_config).start()
            print(f"sidecar serving on {server.address} after {time.perf_counter() - started:.1f} s", flush=True)
            try:
                stub = server.reranker()
                rerank_call(stub, "warm-up query", prepared[0].enforce_hits[next(iter(prepared[0].data.queries))])
                for p in prepared:
                    rerank_concurrent(server, stub, p, args.clients)
                scifact = next((p for p in prepared if p.data.name == "scifact"), None)
                if scifact is not None and args.latency_queries > 0:
                    cpu = server_cpu(server)
                    latencies = enforce_latency(embedder, stub, scifact, args.rerank_depth, fusion,
                                                args.latency_queries)
                    print(f"  [scifact] Enforce-like latency over {len(latencies)} queries: p50 "
                          f"{1000 * statistics.median(latencies):.0f} ms, p95 {1000 * percentile(latencies, 0.95):.0f} "
                          f"ms (sidecar {server_cpu(server) - cpu:.0f} CPU s)", flush=True)
            finally:
                server.stop()
    finally:
        embedder.close()
    table = report(prepared, args.rerank_depth, latencies, args.clients,
                   f"{load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print("\n" + table)
    print(f"total {time.perf_counter() - overall:.0f} s")
    (RESULTS / "beir.md").write_text(table)


if __name__ == "__main__":
    main()
