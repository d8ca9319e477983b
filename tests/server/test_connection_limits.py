"""The HTTP listener's connections are bounded (http/connections.py) and gRPC's have an idle and an age limit,
through a real sidecar: connections that hold a slot without a request cannot lock clients out of either API,
and what the limits do is counted in metrics and logged in a few lines, not a traceback per connection."""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from grpc_health.v1 import health_pb2
from sidecar import Sidecar, default_config, free_port

CONNECTIONS = 2000
# Descriptors the sidecar gets: its HTTP cap becomes half of it, and 2,000 connections are far past both.
SIDECAR_DESCRIPTORS = 512
HALF_SENT_HEAD = b"POST /v2/rerank HTTP/1.1\r\nhost: sidecar\r\ncontent-le"
HALF_SENT_BODY = b'POST /v2/rerank HTTP/1.1\r\nhost: sidecar\r\ncontent-length: 100\r\n\r\n{"query": '


def http_config(**http: float) -> dict:
    config = default_config()
    config["http"] = {"port": free_port(), **http}
    return config


@contextlib.contextmanager
def descriptor_limit(soft: int) -> Iterator[None]:
    """The soft RLIMIT_NOFILE of processes started within (children inherit it), this one's restored after."""
    own, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (own, hard))


@pytest.fixture(autouse=True)
def room_for_the_clients() -> None:
    """This process opens 2,000 sockets."""
    own, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if own < CONNECTIONS + 1000:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))


def address(server: Sidecar) -> tuple[str, int]:
    host, port = server.http_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def open_connections(server: Sidecar, count: int, within_s: float = 30) -> list[socket.socket]:
    """The connections of `count` connecting at once that the server accepts within `within_s` (a full listen
    queue drops a connection's SYN until its retry): every other one silent, the rest stopped partway through a
    request head."""
    waiting = selectors.DefaultSelector()
    for i in range(count):
        connection = socket.socket()
        connection.setblocking(False)
        connection.connect_ex(address(server))
        waiting.register(connection, selectors.EVENT_WRITE, i % 2)
    connections = []
    deadline = time.monotonic() + within_s
    while waiting.get_map() and time.monotonic() < deadline:
        for key, _ in waiting.select(timeout=0.5):
            connection = key.fileobj
            assert isinstance(connection, socket.socket)
            waiting.unregister(connection)
            if connection.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                connection.setblocking(True)
                if key.data:
                    connection.sendall(HALF_SENT_HEAD)
                connections.append(connection)
            else:
                connection.close()
    for key in list(waiting.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    waiting.close()
    return connections


def closed_by_server(connection: socket.socket, within_s: float) -> bool:
    connection.settimeout(within_s)
    try:
        return connection.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def log_lines_about_connections(server: Sidecar, since: int) -> list[str]:
    words = ("connection", "accept", "Traceback", "OSError", "descriptor")
    return [line for line in server.output[since:] if any(word in line for word in words)]


def answered_within_a_second(server: Sidecar) -> None:
    started = time.monotonic()
    assert server.health() == health_pb2.HealthCheckResponse.SERVING
    grpc_s = time.monotonic() - started
    # The client is built before the clock starts: httpx.get builds one per call, loading certifi's CA bundle into an
    # SSL context, which on a busy machine took most of the second measured (the server's answer is what counts).
    with httpx.Client(timeout=5) as client:
        started = time.monotonic()
        assert client.get(server.http_url + "/health").status_code == 200
        http_s = time.monotonic() - started
    assert grpc_s < 1.0 and http_s < 1.0, f"gRPC health {grpc_s:.2f}s, HTTP {http_s:.2f}s"


def test_2000_idle_or_half_sent_connections_leave_both_apis_answering(make_sidecar) -> None:
    with descriptor_limit(SIDECAR_DESCRIPTORS):
        server = make_sidecar(http_config()).start()
    logged = len(server.output)
    connections = open_connections(server, CONNECTIONS)
    assert len(connections) > SIDECAR_DESCRIPTORS
    try:
        answered_within_a_second(server)
        assert server.metric("ragsidecar_http_connections") <= SIDECAR_DESCRIPTORS // 2
        assert server.metric("ragsidecar_http_connections_closed_total", why="evicted") > 0
        assert server.metric("ragsidecar_http_connections_closed_total", why="accept_failed") == 0
    finally:
        for connection in connections:
            connection.close()
    lines = log_lines_about_connections(server, logged)
    assert len(lines) <= 3, "".join(lines)


def test_running_out_of_descriptors_is_logged_once_not_per_accept(make_sidecar) -> None:
    """The cap is set at start-up; descriptors taken away later run out before it, and accept() fails."""
    server = make_sidecar(http_config(max_connections=4000)).start()
    assert server.process
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.prlimit(server.process.pid, resource.RLIMIT_NOFILE, (SIDECAR_DESCRIPTORS, hard))
    logged = len(server.output)
    connections = open_connections(server, CONNECTIONS)
    assert len(connections) > SIDECAR_DESCRIPTORS
    try:
        time.sleep(3)  # asyncio retries a failed accept every second, once per connection it failed to take
    finally:
        for connection in connections:
            connection.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # both listeners retry accepting a second after a failure
        with contextlib.suppress(Exception):
            answered_within_a_second(server)
            break
        time.sleep(0.5)
    answered_within_a_second(server)
    assert server.metric("ragsidecar_http_connections_closed_total", why="accept_failed") >= 1
    lines = log_lines_about_connections(server, logged)
    # gRPC's C core says "File descriptor limit reached. Retrying." once per retry, a second apart.
    ours = [line for line in lines if "posix_engine_listener" not in line]
    assert 1 <= len(ours) <= 2 and len(lines) - len(ours) <= 15, "".join(lines)
    assert not any("Traceback" in line for line in lines)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A sidecar whose HTTP connections time out after a second, and at most 3 are open."""
    config = http_config(idle_timeout_s=1.0, request_timeout_s=1.5, max_connections=3)
    server = Sidecar(tmp_path_factory.mktemp("quick"), config)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.mark.parametrize("sent", [b"", HALF_SENT_HEAD, HALF_SENT_BODY], ids=["silent", "half head", "half body"])
def test_a_connection_without_a_whole_request_in_time_is_closed(quick: Sidecar, sent: bytes) -> None:
    with socket.create_connection(address(quick), timeout=10) as connection:
        connection.sendall(sent)
        started = time.monotonic()
        assert closed_by_server(connection, within_s=10)
        assert 0.8 < time.monotonic() - started < 5


def test_a_keep_alive_connection_is_closed_once_idle(quick: Sidecar) -> None:
    with socket.create_connection(address(quick), timeout=10) as connection:
        connection.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert connection.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert not closed_by_server(connection, within_s=0.5)
        assert closed_by_server(connection, within_s=5)


def test_a_request_sent_slowly_but_in_time_is_answered(quick: Sidecar) -> None:
    with socket.create_connection(address(quick), timeout=10) as connection:
        for part in (b"GET /health HTTP/1.1\r\n", b"host: x\r\n", b"\r\n"):
            connection.sendall(part)
            time.sleep(0.4)
        assert connection.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_past_the_cap_with_every_connection_busy_a_new_one_is_refused(quick: Sidecar) -> None:
    refused = quick.metric("ragsidecar_http_connections_closed_total", why="refused")
    busy = [socket.create_connection(address(quick), timeout=10) for _ in range(3)]
    try:
        for connection in busy:
            connection.sendall(HALF_SENT_BODY)  # a request in flight: not idle, so not closed to make room
        time.sleep(0.2)
        with socket.create_connection(address(quick), timeout=10) as extra:
            assert closed_by_server(extra, within_s=1)
        assert quick.metric("ragsidecar_http_connections_closed_total", why="refused") == refused + 1
    finally:
        for connection in busy:
            connection.close()
