"""Enforce latency for a SEARCH entry over the whole SciFact corpus, with and without rerank of 20.

The corpus (5,183 abstracts) is one .jsonl knowledge file; the first run embeds and indexes it through
the sidecar (timed: the ingest rate) and persists the index under bench/results, so later runs read it
back. Then SciFact test claims go through Enforce one at a time, side by side with and without rerank.

    .venv/bin/python bench/enforce.py [--queries 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import ir_collections as ir_data

from ragsidecar.v1 import retrieval_pb2 as pb
from ragsidecar.v1 import retrieval_pb2_grpc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from retrieval_helpers import PRINCIPAL, SCOPE, entry, llm, params, target  # noqa: E402 - importable once tests/ is on sys.path
from sidecar import Sidecar, default_config  # noqa: E402 - importable once tests/ is on sys.path

RESULTS = REPO / "bench" / "results"


def knowledge_folder() -> Path:
    folder = RESULTS / "enforce-knowledge"
    corpus_file = folder / "scifact.jsonl"
    if not corpus_file.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with corpus_file.open("w") as f:
            for doc_id, text in ir_data.corpus("scifact").items():
                f.write(json.dumps({"id": doc_id, "text": text}) + "\n")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    config = default_config(packaged=True)
    config["paths"]["knowledge_roots"] = [str(knowledge_folder())]
    config["paths"]["data_dir"] = str(RESULTS / "enforce-data")
    config["inference"]["cache_bytes"] = 0
    workdir = RESULTS / "enforce-run"
    workdir.mkdir(parents=True, exist_ok=True)
    server = Sidecar(workdir, config).start()
    try:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(server.channel())
        plain = entry("scifact", "FILE", "SEARCH", "scifact.jsonl", top_k=5)
        reranked = entry(
            "scifact", "FILE", "SEARCH", "scifact.jsonl", top_k=5, search=pb.SearchOptions(rerank=True, candidates=20)
        )
        started = time.perf_counter()
        counts = stub.RequireLoaded(
            pb.RequireLoadedRequest(principal=PRINCIPAL, scope=SCOPE, target=target([plain]), names=["scifact"]),
            timeout=3600,
        ).counts
        load_s = time.perf_counter() - started
        embedded = server.metric("ragsidecar_embedded_chunks_total")
        how = "built" if embedded else "read from disk"
        print(
            f"index: {counts[0].count} documents, {how} in {load_s:.1f}s"
            + (f" ({embedded:.0f} chunks, {embedded / load_s:.1f} chunks/s)" if embedded else "")
        )
        queries, judged = ir_data.queries("scifact"), ir_data.qrels("scifact")
        claims = [(queries[q], set(judged[q])) for q in sorted(judged)[: args.queries]]
        print(f"{len(claims)} SciFact test claims, one Enforce at a time")
        print("| mode | p50 ms | p95 ms | relevant abstract in top 5 |")
        print("|---|---|---|---|")
        for name, knowledge in (("SEARCH", plain), ("SEARCH + rerank 20", reranked)):
            latencies, found = [], 0
            for claim, relevant in claims:
                request = pb.EnforceRequest(
                    principal=PRINCIPAL,
                    scope=SCOPE,
                    action="answer",
                    llm=llm(),
                    target=target([knowledge], {"answer": ["scifact"]}),
                    params=params(claim=claim),
                )
                t0 = time.perf_counter()
                response = stub.Enforce(request, timeout=120)
                latencies.append((time.perf_counter() - t0) * 1000)
                found += any(c.provenance.document_id in relevant for b in response.blocks for c in b.chunks)
            ordered = sorted(latencies)
            print(
                f"| {name} | {statistics.median(ordered):.0f} | {ordered[int(0.95 * (len(ordered) - 1))]:.0f} "
                f"| {found}/{len(claims)} |"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
