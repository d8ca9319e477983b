"""Resident memory of a sidecar serving the default models: what a container's memory request must cover.

Starts the sidecar with the default configuration and samples its RSS (every 50 ms, in a thread):
  idle      both default models loaded and warmed, no call yet
  indexed   after UpsertDocuments of --documents SciFact abstracts into MEMORY knowledge and one Search
  peak      the highest sample while --clients threads send 100-document Rerank requests and Searches
Figures feed deploy/kubernetes (resources.requests / limits).

    .venv/bin/python bench/footprint.py [--documents 2000] [--clients 8] [--rounds 10]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
import threading
from pathlib import Path

import ir_collections
import psutil

from ragsidecar.v1 import reranker_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as rpb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from retrieval_helpers import PRINCIPAL, SCOPE, entry, target  # noqa: E402 - importable once tests/ is on sys.path
from sidecar import Sidecar, default_config  # noqa: E402 - importable once tests/ is on sys.path

MIB = 2**20


class PeakRss:
    """Samples a process's RSS in a thread; `peak` is the highest seen since the last reset."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self._stop = threading.Event()
        self.peak = 0.0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def now(self) -> float:
        return self._process.memory_info().rss / MIB

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.now())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=2000, help="SciFact abstracts upserted as MEMORY knowledge")
    parser.add_argument("--clients", type=int, default=8, help="concurrent callers during the load phase")
    parser.add_argument("--rounds", type=int, default=10, help="Rerank + Search calls per caller")
    args = parser.parse_args()
    corpus = list(ir_collections.corpus("scifact").items())[: args.documents]
    claims = list(ir_collections.queries("scifact").values())
    with tempfile.TemporaryDirectory() as workdir:
        server = Sidecar(Path(workdir), default_config(packaged=True)).start()
        rss = PeakRss(server.process.pid)
        try:
            idle = rss.now()
            print(f"idle: {idle:.0f} MiB", flush=True)
            retrieval = retrieval_pb2_grpc.RetrievalServiceStub(server.channel())
            retrieval.UpsertDocuments(
                rpb.UpsertDocumentsRequest(
                    principal=PRINCIPAL,
                    scope=SCOPE,
                    knowledge="abstracts",
                    documents=[rpb.MemoryDocument(id=i, text=t) for i, t in corpus],
                ),
                timeout=3600,
            )
            search = target([entry("abstracts", "MEMORY", "SEARCH", top_k=10)])
            retrieval.Search(
                rpb.SearchRequest(principal=PRINCIPAL, scope=SCOPE, target=search, query=claims[0]), timeout=600
            )
            indexed = rss.now()
            print(f"indexed: {indexed:.0f} MiB", flush=True)
            reranker = server.reranker()

            def caller(c: int) -> None:
                for r in range(args.rounds):
                    claim = claims[(c * args.rounds + r) % len(claims)]
                    documents = [reranker_pb2.RerankDocument(id=i, text=t) for i, t in corpus[r * 100 : (r + 1) * 100]]
                    reranker.Rerank(reranker_pb2.RerankRequest(query=claim, documents=documents), timeout=600)
                    retrieval.Search(
                        rpb.SearchRequest(principal=PRINCIPAL, scope=SCOPE, target=search, query=claim), timeout=600
                    )

            with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                list(pool.map(caller, range(args.clients)))
        finally:
            rss.stop()
            server.stop()
    print(
        f"sidecar RSS (MiB), default models, {args.documents} MEMORY documents, {args.clients} callers: "
        f"idle {idle:.0f}, indexed {indexed:.0f}, peak under load {rss.peak:.0f}"
    )


if __name__ == "__main__":
    main()
