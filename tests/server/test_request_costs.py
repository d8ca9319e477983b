"""A request over a cap costs what the cap allows, not what was sent: the largest request each API accepts, made
of the cheapest items to send (64 MiB of JSON numbers, nulls or empty strings over HTTP; empty repeated messages
over gRPC), is refused in bounded time and memory by a real sidecar.

Without the bounds these took seconds per few MiB and GiB of memory (issue 33: 8 M numbers, 15 MiB, 16.5 s and
2.6 GiB). The time bounds are generous for a loaded machine; the memory bound is what the check is about.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from sidecar import Sidecar, default_config, free_port

from ragsidecar.config import ServerConfig
from ragsidecar.v1 import reranker_pb2

# The figure for HTTP; gRPC's largest request is the default server.max_message_bytes.
HTTP_BODY = 64 * 1024 * 1024
GRPC_LIMIT = ServerConfig().max_message_bytes


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A sidecar whose byte limit lets a 64 MiB body in, so that only the scan stands in its way."""
    config = default_config()
    config["server"]["max_message_bytes"] = HTTP_BODY
    config["http"] = {"port": free_port()}
    server = Sidecar(tmp_path_factory.mktemp("costs"), config)
    try:
        yield server.start()
    finally:
        server.stop()


class PeakRss:
    """The sidecar's largest resident memory while the block runs, sampled every few milliseconds."""

    def __init__(self, server: Sidecar) -> None:
        self._server = server
        self.before = server.rss_mib()
        self.peak = self.before
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self._server.rss_mib())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._server.rss_mib())

    @property
    def growth(self) -> int:
        return self.peak - self.before


def cpu_s(server: Sidecar) -> float:
    """The sidecar's CPU seconds so far, all threads (user and system): unlike wall time, what a loaded machine
    leaves alone."""
    assert server.process
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def body_of(item: bytes, path: str) -> bytes:
    """A request of `item`s filling 64 MiB, in the array each endpoint reads."""
    field = {"/v2/rerank": b"documents", "/rerank": b"texts", "/v1/embeddings": b"input"}[path]
    head = b'{"query": "q", "model": "", "' + field + b'": ['
    count = (HTTP_BODY - len(head) - 2) // (len(item) + 1)
    return head + b",".join([item] * count) + b"]}"


def post_raw(url: str, path: str, body: bytes) -> tuple[float, bytes, socket.socket]:
    """Sends the request on a raw socket; the seconds until the response's first bytes (read while the body is
    still being sent), the response, and the connection (its body sent in full)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=60)
    head = f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
    head += f"content-length: {len(body)}\r\n\r\n"
    started = time.monotonic()
    answered: list[float] = []
    response = bytearray()

    def read() -> None:
        while b"\r\n\r\n" not in response or not response.endswith(b"}"):
            response.extend(connection.recv(65536))
            answered.append(time.monotonic() - started)

    reader = threading.Thread(target=read)
    reader.start()
    connection.sendall(head.encode() + body)
    reader.join(60)
    return answered[0], bytes(response), connection


@pytest.mark.parametrize(("item", "path"), [(b"1", "/v2/rerank"), (b"null", "/rerank"), (b'""', "/v1/embeddings")])
def test_64_mib_of_tiny_json_items_is_refused_in_a_second(served: Sidecar, item: bytes, path: str) -> None:
    body = body_of(item, path)
    assert HTTP_BODY - 8 < len(body) <= HTTP_BODY
    cpu = cpu_s(served)
    with PeakRss(served) as rss:
        elapsed, response, connection = post_raw(served.http_url, path, body)
    cpu = cpu_s(served) - cpu
    print(f"\n{path} {item!r}: answered after {elapsed:.3f}s, server CPU {cpu:.2f}s, RSS +{rss.growth} MiB")
    assert response.startswith(b"HTTP/1.1 413 "), response[:200]
    assert b"LIMIT_EXCEEDED" in response and b"more than 1000 items" in response
    # The server's own work (reading past the rest of the body included) within a second; the wall-clock bound
    # is loose, for a machine busy with other work.
    assert cpu < 1.0 and elapsed < 10, f"refused after {elapsed:.2f}s, {cpu:.2f}s of server CPU"
    assert rss.growth < 100, f"RSS grew {rss.growth} MiB"
    # The refused body was read past, not left in the stream: the connection serves the next request.
    with connection:
        connection.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert connection.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_the_largest_grpc_request_of_empty_documents_is_refused_in_two_seconds(make_sidecar) -> None:
    served = make_sidecar().start()  # the default limits
    head = reranker_pb2.RerankRequest(query="q").SerializeToString()
    raw = head + b"\x1a\x00" * ((GRPC_LIMIT - len(head)) // 2)  # documents (field 3), each an empty message
    assert GRPC_LIMIT - 2 < len(raw) <= GRPC_LIMIT
    channel = grpc.insecure_channel(served.address, options=[("grpc.max_send_message_length", GRPC_LIMIT)])
    rerank = channel.unary_unary("/ragsidecar.v1.RerankerService/Rerank")
    cpu = cpu_s(served)
    with PeakRss(served) as rss:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            rerank(raw, timeout=60)
        elapsed = time.monotonic() - started
    cpu = cpu_s(served) - cpu
    channel.close()
    print(f"\ngrpc, {len(raw)} bytes: refused after {elapsed:.3f}s, server CPU {cpu:.2f}s, RSS +{rss.growth} MiB")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert "server.max_message_fields" in (refused.value.details() or "")
    # As for HTTP: the server's work within two seconds, the wall clock loosely (without the count: a minute).
    assert cpu < 2.0 and elapsed < 20, f"refused after {elapsed:.2f}s, {cpu:.2f}s of server CPU"
    assert rss.growth < 200, f"RSS grew {rss.growth} MiB"


def test_a_request_within_the_field_cap_still_parses_and_runs(served: Sidecar) -> None:
    documents = [reranker_pb2.RerankDocument(id=str(i), text="Paris is in France.") for i in range(3)]
    response = served.reranker().Rerank(reranker_pb2.RerankRequest(query="France", documents=documents), timeout=60)
    assert len(response.results) == 3


def test_a_lower_field_cap_refuses_what_it_does_not_allow(make_sidecar) -> None:
    config = default_config()
    config["server"] = {"max_message_fields": 10}
    server = make_sidecar(config).start()
    documents = [reranker_pb2.RerankDocument(id=str(i), text="t", metadata={"k": "v"}) for i in range(3)]
    with pytest.raises(grpc.RpcError) as refused:
        server.reranker().Rerank(reranker_pb2.RerankRequest(query="q", documents=documents), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "more than 10 fields" in (refused.value.details() or "")
    server.reranker().Rerank(reranker_pb2.RerankRequest(query="q", documents=documents[:1]), timeout=60)
