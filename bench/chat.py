"""GroundTurn latency against the raw cost of the same searches, side by side in one run.

Three owners, each with a declared binding whose live corpus is 200 SciFact abstracts (top_k 5). The same
documents are also upserted as three MEMORY sources, so RetrievalService.Search runs the very searches a
turn runs, on identical indexes. Then SciFact test claims go, one at a time, through GroundTurn (3 owners,
a state each, one DIRECT block each), through 3 sequential Search calls (a host searching per owner) and
through one Search over the 3 sources (the same work as a turn's searches: one query embedding, three
indexes). GroundTurn minus that one Search is the grounding overhead: binding checks, DIRECT measuring,
rendering, fencing and the larger messages.

    .venv/bin/python bench/chat.py [--queries 100]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import ir_collections as ir_data

from ragsidecar.v1 import chat_knowledge_pb2 as pb
from ragsidecar.v1 import (
    chat_knowledge_pb2_grpc,
    retrieval_pb2_grpc,
)
from ragsidecar.v1 import retrieval_pb2 as rpb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from retrieval_helpers import PRINCIPAL, SCOPE, entry, llm, target  # noqa: E402 - importable once tests/ is on sys.path
from sidecar import Sidecar, default_config  # noqa: E402 - importable once tests/ is on sys.path

RESULTS = REPO / "bench" / "results"
OWNERS, DOCUMENTS, TOP_K = 3, 200, 5


def corpora() -> list[list[rpb.MemoryDocument]]:
    texts = list(ir_data.corpus("scifact").items())
    return [
        [rpb.MemoryDocument(id=i, text=t) for i, t in texts[o * DOCUMENTS : (o + 1) * DOCUMENTS]] for o in range(OWNERS)
    ]


def open_bindings(chat, documents: list[list[rpb.MemoryDocument]]) -> list[pb.OpenBindingResponse]:
    opened = []
    for o, docs in enumerate(documents):
        binding = chat.OpenBinding(
            pb.OpenBindingRequest(
                principal=PRINCIPAL, scope=SCOPE, owner_id=f"owner-{o}", source="log", top_k=TOP_K, declared=True
            )
        )
        chat.AppendToBinding(
            pb.AppendToBindingRequest(
                principal=PRINCIPAL,
                scope=SCOPE,
                binding_id=binding.binding_id,
                binding_handle=binding.binding_handle,
                owner_id=f"owner-{o}",
                documents=docs,
            ),
            timeout=600,
        )
        opened.append(binding)
    return opened


def turn_request(bindings: list[pb.OpenBindingResponse], claim: str) -> pb.GroundTurnRequest:
    owners = [
        pb.ChatOwner(
            owner_id=f"owner-{o}",
            state_text=f"## Current State\n- turn: {o}",
            knowledge=[
                entry("log", "MEMORY", "SEARCH", top_k=TOP_K),
                entry(
                    "persona",
                    "INLINE",
                    "DIRECT",
                    inline_text=f"You are reviewer {o}; cite the abstracts.",
                    max_tokens=50,
                ),
            ],
        )
        for o in range(OWNERS)
    ]
    return pb.GroundTurnRequest(
        principal=PRINCIPAL,
        owners=owners,
        llm=llm(window=128_000),
        conversation=[
            pb.ChatMessage(role="system", content="You review scientific claims."),
            pb.ChatMessage(role="user", content=claim),
        ],
        bindings=[
            pb.TurnBinding(binding_id=b.binding_id, binding_handle=b.binding_handle, owner_id=f"owner-{o}")
            for o, b in enumerate(bindings)
        ],
        context=pb.ChatRetrievalContext(scope=SCOPE),
    )


def search_request(names: list[str], claim: str) -> rpb.SearchRequest:
    sources = [entry(f"log-{o}", "MEMORY", "SEARCH", top_k=TOP_K) for o in range(OWNERS)]
    return rpb.SearchRequest(principal=PRINCIPAL, scope=SCOPE, target=target(sources), knowledge=names, query=claim)


def timed(call) -> tuple[float, object]:
    started = time.perf_counter()
    response = call()
    return (time.perf_counter() - started) * 1000, response


def row(name: str, latencies: list[float]) -> str:
    ordered = sorted(latencies)
    return f"| {name} | {statistics.median(ordered):.1f} | {ordered[int(0.95 * (len(ordered) - 1))]:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    config = default_config(packaged=True)
    config["paths"]["data_dir"] = str(RESULTS / "chat-data")
    config["inference"]["cache_bytes"] = 0
    workdir = RESULTS / "chat-run"
    workdir.mkdir(parents=True, exist_ok=True)
    server = Sidecar(workdir, config).start()
    try:
        chat = chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub(server.channel())
        retrieval = retrieval_pb2_grpc.RetrievalServiceStub(server.channel())
        documents = corpora()
        bindings = open_bindings(chat, documents)
        for o, docs in enumerate(documents):
            retrieval.UpsertDocuments(
                rpb.UpsertDocumentsRequest(principal=PRINCIPAL, scope=SCOPE, knowledge=f"log-{o}", documents=docs),
                timeout=600,
            )
        queries, judged = ir_data.queries("scifact"), ir_data.qrels("scifact")
        claims = [queries[q] for q in sorted(judged)[: args.queries]]
        build_ms, _ = timed(lambda: chat.GroundTurn(turn_request(bindings, claims[0]), timeout=3600))
        retrieval.Search(search_request([], claims[0]), timeout=600)  # same vectors: indexed from the cache
        print(
            f"{OWNERS} owners x {DOCUMENTS} documents, top_k {TOP_K}; first turn (indexing the live corpora) "
            f"{build_ms / 1000:.1f}s; {len(claims)} SciFact claims, one call at a time"
        )
        turns, three, one = [], [], []
        for claim in claims:
            ground_ms, response = timed(functools.partial(chat.GroundTurn, turn_request(bindings, claim), timeout=60))
            assert all(o.document_count == TOP_K for o in response.owners), response.owners
            each = [
                timed(functools.partial(retrieval.Search, search_request([f"log-{o}"], claim), timeout=60))[0]
                for o in range(OWNERS)
            ]
            one.append(timed(functools.partial(retrieval.Search, search_request([], claim), timeout=60))[0])
            turns.append(ground_ms)
            three.append(sum(each))
        print("| call | p50 ms | p95 ms |")
        print("|---|---|---|")
        print(row(f"GroundTurn: {OWNERS} owners, each searched through its binding", turns))
        print(row(f"{OWNERS} x Search, one per equivalent MEMORY source, sequential", three))
        print(row(f"1 x Search over the {OWNERS} MEMORY sources", one))
        print(
            row("GroundTurn minus the 1 Search (grounding overhead)", [t - o for t, o in zip(turns, one, strict=True)])
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
