"""Hostile sizes: the sidecar's resident memory across 40 MiB requests, and validating an 8 MiB DIRECT text.

Part one sends refused requests of about 40 MiB each, the largest the 48 MiB message cap
lets through (one 40 MiB Rerank document; 1,000 Rerank documents of 40 KB; a 40 MiB UpsertDocuments; a 40 MiB
PrepareChatKnowledge agent_id) for a few rounds, and reports the
server's RSS after each request and after idling: it should come back near where it started. Part two times
ValidateConfiguration of one 8 MiB INLINE DIRECT entry (without a model, whose window is then unknown; with
gpt-4o's window; with max_tokens 1000) and reports the RSS it adds.

    .venv/bin/python bench/large_requests.py [--rounds 2] [--validations 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from ragsidecar.v1 import reranker_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from retrieval_helpers import PRINCIPAL, SCOPE, entry, retrieval_config, target  # noqa: E402 - importable once tests/ is on sys.path
from sidecar import Sidecar  # noqa: E402 - importable once tests/ is on sys.path

BIG = 40 << 20


def big_requests(server: Sidecar, channel: grpc.Channel) -> dict[str, Callable[[], object]]:
    reranker, retrieval = server.reranker(channel), retrieval_pb2_grpc.RetrievalServiceStub(channel)
    huge = "x" * BIG
    many = [reranker_pb2.RerankDocument(text="word " * 8_000)] * 1000
    return {
        "Rerank, one 40 MiB document": lambda: reranker.Rerank(
            reranker_pb2.RerankRequest(query="q", documents=[reranker_pb2.RerankDocument(text=huge)]), timeout=300
        ),
        "Rerank, 1,000 documents of 40 KB": lambda: reranker.Rerank(
            reranker_pb2.RerankRequest(query="q", documents=many), timeout=300
        ),
        "UpsertDocuments, 40 MiB": lambda: retrieval.UpsertDocuments(
            pb.UpsertDocumentsRequest(
                principal=PRINCIPAL, scope=SCOPE, knowledge="notes", documents=[pb.MemoryDocument(id="a", text=huge)]
            ),
            timeout=300,
        ),
        "PrepareChatKnowledge, 40 MiB agent_id": lambda: retrieval.PrepareChatKnowledge(
            pb.PrepareChatKnowledgeRequest(principal=PRINCIPAL, scope=SCOPE, agent_id=huge), timeout=300
        ),
    }


def outcome(call: Callable[[], object]) -> str:
    try:
        call()
        return "OK"
    except grpc.RpcError as err:
        return err.code().name


def memory_across_big_requests(server: Sidecar, channel: grpc.Channel, rounds: int) -> None:
    start = server.rss_mib()
    print(f"\n40 MiB requests: RSS at start {start} MiB")
    calls = big_requests(server, channel)
    for round_ in range(1, rounds + 1):
        for label, call in calls.items():
            began = time.perf_counter()
            result = outcome(call)
            print(
                f"  round {round_}  {label:<40} {result:<18} {time.perf_counter() - began:5.1f} s  "
                f"RSS {server.rss_mib()} MiB"
            )
    time.sleep(5)
    print(f"  after 5 s idle: RSS {server.rss_mib()} MiB ({server.rss_mib() / start:.2f}x start)")


def validating_a_big_direct_text(server: Sidecar, channel: grpc.Channel, validations: int) -> None:
    stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
    words = "the quick brown fox jumps over the lazy dog near the riverbank at dawn ".split()
    text = " ".join(words[i % len(words)] + ("\n" if i % 17 == 0 else "") for i in range(1_500_000))[: 8 << 20]
    print("\nValidateConfiguration, one 8 MiB INLINE DIRECT entry")
    gpt_4o = {"llm": pb.Llm(model="gpt-4o")}
    cases = {
        "no model (window unknown)": ({}, {}),
        "gpt-4o (shared budget 32,000)": (gpt_4o, {}),
        "max_tokens 1000": (gpt_4o, {"max_tokens": 1000}),
    }
    for label, (fields, entry_fields) in cases.items():
        request = pb.ValidateConfigurationRequest(
            principal=PRINCIPAL,
            scope=SCOPE,
            target=target([entry("big", "INLINE", "DIRECT", inline_text=text, **entry_fields)]),
            **fields,
        )
        for _ in range(validations):
            before, began = server.rss_mib(), time.perf_counter()
            response = stub.ValidateConfiguration(request, timeout=600)
            print(
                f"  {label:<32} {time.perf_counter() - began:6.2f} s  RSS {before} -> {server.rss_mib()} MiB  "
                f"{response.violations[0].description[:70] if response.violations else 'valid'}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--validations", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "knowledge").mkdir()
        server = Sidecar(work, retrieval_config(work / "knowledge", work / "data"))
        try:
            server.start()
            channel = server.channel(**{"grpc.max_send_message_length": 128 << 20})
            memory_across_big_requests(server, channel, args.rounds)
            validating_a_big_direct_text(server, channel, args.validations)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
