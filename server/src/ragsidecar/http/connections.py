"""The HTTP listener's connections, bounded: how many, how long one may sit idle, how long a request may take to
arrive, and what running out of file descriptors costs.

uvicorn holds a connection until its client closes it when no request has arrived yet (its keep-alive timer starts
only after a response), and keeps a half-sent request head or body waiting forever; a few hundred such connections,
which need no token, used every file descriptor, and asyncio then logged a traceback per failed accept. Here:

- a connection with no request in flight (new, idle after a response, or partway through a request head) is closed
  after `http.idle_timeout_s`, a request whose head and body have not all arrived `http.request_timeout_s` after
  its first byte is dropped;
- at most `http.max_connections` are open (and no more than a quarter of the process's file descriptors, so that
  gRPC always has some): a connection past the cap closes the longest-idle connection with no request in flight, or is
  refused when every one has a request in flight;
- refusals, idle connections closed for room, slow requests dropped and failed accepts are counted in
  `ragsidecar_http_connections_closed_total{why}` and logged at most once a minute, without a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ragsidecar import metrics

log = logging.getLogger("ragsidecar.http")

# A listener's log of the above: its first event at once, then at most one line a minute.
LOG_INTERVAL_S = 60.0
# asyncio's message for an accept() that failed for want of file descriptors or memory (it retries a second later).
ACCEPT_FAILED = "socket.accept() out of system resource"


@dataclass
class ConnectionLimits:
    """The listener's limits and what they did, shared by all its connections."""

    max_connections: int
    idle_timeout_s: float
    request_timeout_s: float
    # Connections asyncio accepts in one go (the listen backlog too: uvicorn's 2048 where descriptors allow),
    # each holding a descriptor before its protocol can refuse it or make room.
    accept_burst: int = 2048
    _unlogged: Counter[str] = field(default_factory=Counter)
    _logged_at: float = -LOG_INTERVAL_S

    @classmethod
    def within_descriptors(
        cls, max_connections: int, idle_timeout_s: float, request_timeout_s: float
    ) -> ConnectionLimits:
        """The limits, within the process's file descriptors: open connections at most a quarter of them, and as
        many again accepted or closing at once, so that at least half are left to gRPC and the rest."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return cls(max_connections, idle_timeout_s, request_timeout_s)
        if max_connections > soft // 4:
            log.info(
                "http.max_connections lowered from %d to %d: a quarter of the process's %d file descriptors",
                max_connections,
                max(1, soft // 4),
                soft,
            )
        burst = max(8, min(2048, soft // 8))
        return cls(min(max_connections, max(1, soft // 4)), idle_timeout_s, request_timeout_s, burst)

    def closed(self, why: str, detail: str = "") -> None:
        """Counts a connection closed or refused; logs what was counted at most once a minute."""
        metrics.HTTP_CONNECTIONS_CLOSED.labels(why).inc()
        self._unlogged[why] += 1
        now = time.monotonic()
        if now - self._logged_at < LOG_INTERVAL_S:
            return
        self._logged_at = now
        counts = ", ".join(f"{why}={count}" for why, count in sorted(self._unlogged.items()))
        self._unlogged.clear()
        log.warning(
            "http connections closed or refused (%s) since the last report; max_connections=%d%s; "
            "next report in %.0fs at the earliest",
            counts,
            self.max_connections,
            f"; {detail}" if detail else "",
            LOG_INTERVAL_S,
        )

    def exception_handler(self, previous: Any) -> Any:
        """The event loop's exception handler with failed accepts counted and logged as `closed` does, not once
        each with a traceback."""

        def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if context.get("message") == ACCEPT_FAILED:
                self.closed("accept_failed", f"accept failed: {context.get('exception')}")
            elif _retried_accept_after_close(context):
                log.debug("an accept retry found the HTTP listener closed")
            elif previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        return handle

    def protocol(self) -> type[asyncio.Protocol]:
        """uvicorn's HTTP/1.1 protocol bounded by these limits."""
        return type("BoundedH11Protocol", (BoundedH11Protocol,), {"limits": self})


def _retried_accept_after_close(context: dict[str, Any]) -> bool:
    """asyncio retries a failed accept a second later, once per failed attempt (up to the backlog of them); a
    retry that runs after the listener closed fails on the closed socket (ValueError) with a traceback each."""
    callback = getattr(context.get("handle"), "_callback", None)
    return getattr(callback, "__name__", "") == "_start_serving" and isinstance(context.get("exception"), ValueError)


class BoundedH11Protocol(H11Protocol):
    """One connection: admitted under the cap, closed when idle or when its request arrives too slowly."""

    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.idle_timeout_s  # type: ignore[assignment]  # uvicorn's is an int
        self.last_active = time.monotonic()
        self._refused = False
        self._request_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections and not self._make_room():
            self._refused = True
            self.limits.closed("refused")
            transport.abort()
            return
        super().connection_made(transport)
        metrics.HTTP_CONNECTIONS.inc()
        # uvicorn starts its keep-alive timer only after a response: a connection that never sends a byte
        # would be held for ever. The first byte cancels it (data_received), as it does after a response.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        metrics.HTTP_CONNECTIONS.dec()
        self._cancel_request_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        if self._request_timer is None:
            self._request_timer = self.loop.call_later(self.limits.request_timeout_s, self._request_too_slow)
        super().data_received(data)
        if self._request_arrived() or self._between_requests():
            self._cancel_request_timer()

    def on_response_complete(self) -> None:
        self.last_active = time.monotonic()
        super().on_response_complete()

    def waiting_for_request(self) -> bool:
        """No request in flight: new, idle after a response, or partway through a head."""
        return (self.cycle is None or self.cycle.response_complete) and self.conn.their_state is not h11.SEND_BODY

    def _request_arrived(self) -> bool:
        return self.conn.their_state is h11.DONE

    def _between_requests(self) -> bool:
        return self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]

    def _cancel_request_timer(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _request_too_slow(self) -> None:
        self._request_timer = None
        if not self.transport.is_closing():
            self.limits.closed("slow_request")
            self.transport.abort()

    def _make_room(self) -> bool:
        """Closes the longest-idle connection with no request in flight; False when there is none."""
        idle = [c for c in self.connections if isinstance(c, BoundedH11Protocol) and c.waiting_for_request()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.last_active)
        self.connections.discard(oldest)
        self.limits.closed("evicted")
        oldest.transport.abort()
        return True
