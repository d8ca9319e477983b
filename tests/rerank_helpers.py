"""RerankerService documents and a load of concurrent Rerank clients, shared by the reranker tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import grpc
from sidecar import Sidecar

from ragsidecar.v1 import reranker_pb2


def docs(*texts: str) -> list[reranker_pb2.RerankDocument]:
    return [reranker_pb2.RerankDocument(id=f"d{i}", text=t) for i, t in enumerate(texts)]


@contextlib.contextmanager
def rerank_load(server: Sidecar, clients: int, documents: int) -> Iterator[list[str]]:
    """Client threads sending Rerank calls until the block ends; yields their outcomes: "ok", "short"
    (results missing) or a status code name."""
    stop = threading.Event()
    outcomes: list[str] = []

    def load() -> None:
        stub = server.reranker()
        i = 0
        while not stop.is_set():
            i += 1
            try:
                response = stub.Rerank(
                    reranker_pb2.RerankRequest(
                        query=f"query {i}", documents=docs(*[f"doc {d} {i}" for d in range(documents)])
                    ),
                    timeout=30,
                )
                outcomes.append("ok" if len(response.results) == documents else "short")
            except grpc.RpcError as err:
                outcomes.append(err.code().name)

    workers = [threading.Thread(target=load, daemon=True) for _ in range(clients)]
    for worker in workers:
        worker.start()
    try:
        yield outcomes
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
