"""Server interceptors: bearer-token authentication, and one log line plus metrics per request."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ragsidecar import metrics
from ragsidecar.api.status import abort
from ragsidecar.errors import ErrorKind, SidecarError

log = logging.getLogger("ragsidecar.requests")

_HEALTH_PREFIX = "/grpc.health.v1.Health/"


def _replace_behaviour(handler: grpc.RpcMethodHandler, wrap: Callable[[Any], Any]) -> grpc.RpcMethodHandler:
    """The same handler with its behaviour wrapped, whatever its streaming shape."""
    shapes = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    )
    for attribute, build in shapes:
        behaviour = getattr(handler, attribute)
        if behaviour is not None:
            return build(wrap(behaviour), handler.request_deserializer, handler.response_serializer)
    return handler


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on every service but health."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_HEALTH_PREFIX):
            return handler
        sent = dict(details.invocation_metadata or ()).get("authorization", "")
        sent_bytes = sent.encode() if isinstance(sent, str) else sent
        if hmac.compare_digest(sent_bytes, self._expected):
            return handler
        why = "missing bearer token" if not sent else "wrong bearer token"

        def refuse(_behaviour: Any) -> Any:
            async def denied(_request: Any, context: grpc.aio.ServicerContext) -> None:
                await abort(context, SidecarError(ErrorKind.UNAUTHENTICATED, "UNAUTHENTICATED", why))

            return denied

        return _replace_behaviour(handler, refuse)


class AccessLogInterceptor(grpc.aio.ServerInterceptor):
    """One INFO line per unary request (method, code, duration), and request metrics."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = details.method
        # Health probes arrive every few seconds from orchestrators: keep them out of the INFO log.
        level = logging.DEBUG if method.startswith(_HEALTH_PREFIX) else logging.INFO

        def wrap(behaviour: Any) -> Any:
            async def logged(request: Any, context: grpc.aio.ServicerContext) -> Any:
                started = time.perf_counter()
                cancelled = False
                try:
                    return await behaviour(request, context)
                except asyncio.CancelledError:
                    cancelled = True
                    raise
                finally:
                    code = grpc.StatusCode.CANCELLED if cancelled else context.code() or grpc.StatusCode.OK
                    code_name = code.name if isinstance(code, grpc.StatusCode) else str(code)
                    elapsed = time.perf_counter() - started
                    metrics.REQUESTS.labels(method, code_name).inc()
                    metrics.LATENCY.labels(method).observe(elapsed)
                    log.log(level, "method=%s code=%s duration_ms=%.1f", method, code_name, elapsed * 1000)

            return logged

        return _replace_behaviour(handler, wrap)
