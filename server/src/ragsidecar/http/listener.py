"""The HTTP listener: uvicorn serving the API app in the sidecar's own event loop, beside the gRPC server, its
connections bounded by http/connections.py.

The socket is bound here, before uvicorn starts, so a port in use fails start-up with the OSError (uvicorn would
exit the process). Signals stay the sidecar's: SIGTERM drains both listeners, with the same grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
from collections.abc import Iterator

import uvicorn

from ragsidecar.config import Config
from ragsidecar.http.app import Services, build_app
from ragsidecar.http.connections import ConnectionLimits

# uvicorn logs each start and stop of its server at INFO; the sidecar prints where it listens itself.
logging.getLogger("uvicorn.error").setLevel(logging.WARNING)


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """The sidecar handles SIGTERM/SIGINT (stopping this server through `should_exit`)."""
        yield


class HttpListener:
    def __init__(self, config: Config, services: Services) -> None:
        self._config = config
        tls = config.tls
        http = config.http
        self._limits = ConnectionLimits.within_descriptors(
            http.max_connections, http.idle_timeout_s, http.request_timeout_s
        )
        self._server = _EmbeddedServer(
            uvicorn.Config(
                build_app(services),
                http=self._limits.protocol(),
                backlog=self._limits.accept_burst,
                lifespan="off",
                log_config=None,
                access_log=False,
                server_header=False,
                proxy_headers=False,
                timeout_graceful_shutdown=math.ceil(config.server.shutdown_grace_s),
                ssl_certfile=str(config.resolve(tls.cert_file)) if tls.cert_file else None,
                ssl_keyfile=str(config.resolve(tls.key_file)) if tls.key_file else None,
            )
        )
        self._task: asyncio.Task | None = None

    async def start(self) -> str:
        """Binds the configured address and starts serving; returns the URL it serves on."""
        host = self._config.http.host
        sock = _listening_socket(host, self._config.http.port)
        loop = asyncio.get_running_loop()
        # Kept after stop(): asyncio's retries of failed accepts may still be due then.
        loop.set_exception_handler(self._limits.exception_handler(loop.get_exception_handler()))
        self._task = loop.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # start-up failed: raise why
            await asyncio.sleep(0.01)
        bound = sock.getsockname()[1]
        scheme = "https" if self._config.tls.cert_file else "http"
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{bound}"

    async def stop(self) -> None:
        """Stops accepting connections and lets requests in flight finish within the grace period."""
        if self._task is None:
            return
        self._server.should_exit = True
        await self._task


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on the address; its protocol stated (IPPROTO_TCP), since asyncio sets TCP_NODELAY
    only on connections accepted from such a socket (and with Nagle's algorithm every keep-alive response waited
    for the client's delayed ACK: 40 ms)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock
