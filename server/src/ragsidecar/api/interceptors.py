"""Server interceptors: undecodable requests, bearer-token authentication, one log line plus metrics per request."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor

from ragsidecar import metrics, tracing
from ragsidecar.api.field_count import check_field_count
from ragsidecar.api.grpc_errors import abort
from ragsidecar.auth import BearerToken
from ragsidecar.errors import ErrorKind, SidecarError

log = logging.getLogger("ragsidecar.requests")

_HEALTH_PREFIX = "/grpc.health.v1.Health/"


def _replace_behaviour(
    handler: grpc.RpcMethodHandler, wrap: Callable[[Any], Any], deserializer: Callable[[bytes], Any] | None = None
) -> grpc.RpcMethodHandler:
    """The same handler with its behaviour wrapped (and its request decoder replaced), whatever its shape."""
    shapes = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    )
    for attribute, build in shapes:
        behaviour = getattr(handler, attribute)
        if behaviour is not None:
            return build(wrap(behaviour), deserializer or handler.request_deserializer, handler.response_serializer)
    return handler


@dataclass(frozen=True)
class _Undecodable:
    """Stands in for a request message that was not parsed: its bytes did not parse, or held too many fields."""

    error: SidecarError


def _tolerant(deserialize: Callable[[bytes], Any], method: str, max_fields: int) -> Callable[[bytes], Any]:
    # The generated decoder is the message class's FromString: its descriptor lets the fields be counted first.
    descriptor = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)

    def decode(raw: bytes) -> Any:
        try:
            if isinstance(descriptor, Descriptor):
                check_field_count(raw, descriptor, max_fields)
            return deserialize(raw)
        except SidecarError as err:
            return _Undecodable(err)
        except Exception as err:  # whatever the parser raises, the caller's bytes are at fault
            message = f"the request to {method} could not be decoded: {type(err).__name__}: {err}"
            return _Undecodable(SidecarError(ErrorKind.INVALID_ARGUMENT, "INVALID_REQUEST", message))

    return decode


class DecodeGuardInterceptor(grpc.aio.ServerInterceptor):
    """Undecodable requests (corrupt bytes, invalid UTF-8, nesting too deep) get INVALID_ARGUMENT, not UNKNOWN,
    and requests of more than `max_fields` fields LIMIT_EXCEEDED before they are parsed (api/field_count.py).

    grpc.aio answers a request whose deserializer raises with UNKNOWN and logs a traceback; instead the
    decoder hands on a marker and the behaviour refuses it, on every method (health and reflection too).
    """

    def __init__(self, max_fields: int) -> None:
        self._max_fields = max_fields

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = details.method
        # Unary-unary calls get their one line from the access log; the streaming ones get it here.
        quiet = handler.unary_unary is not None

        async def refuse(request: _Undecodable, context: grpc.aio.ServicerContext) -> None:
            if not quiet:
                log.info("method=%s code=INVALID_ARGUMENT refused request: %s", method, request.error.message)
            await abort(context, request.error)

        def wrap(behaviour: Any) -> Any:
            streams_requests = handler.stream_unary is not None or handler.stream_stream is not None
            if streams_requests:
                return _checking_each_request(behaviour, refuse)
            return _checking_the_request(behaviour, refuse)

        return _replace_behaviour(handler, wrap, _tolerant(handler.request_deserializer, method, self._max_fields))


def _checking_the_request(behaviour: Any, refuse: Callable[[Any, Any], Awaitable[None]]) -> Any:
    """Keeps the behaviour's kind (coroutine or async generator): grpc.aio serves the two differently."""
    if inspect.isasyncgenfunction(behaviour):

        async def checked_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            async for response in behaviour(request, context):
                yield response

        return checked_stream

    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await refuse(request, context)
        return await behaviour(request, context)

    return checked


def _checking_each_request(behaviour: Any, refuse: Callable[[Any, Any], Awaitable[None]]) -> Any:
    """Client-streaming methods: each message is checked as the behaviour reads it."""

    def requests_of(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async def checked_requests() -> Any:
            async for request in requests:
                if isinstance(request, _Undecodable):
                    await refuse(request, context)
                yield request

        return checked_requests()

    if inspect.isasyncgenfunction(behaviour):

        async def checked_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async for response in behaviour(requests_of(requests, context), context):
                yield response

        return checked_stream

    async def checked(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behaviour(requests_of(requests, context), context)

    return checked


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` (auth.BearerToken) on every service but health; a refused call's
    request bytes are never decoded."""

    def __init__(self, token: str) -> None:
        self._token = BearerToken(token)

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_HEALTH_PREFIX):
            return handler
        sent = [value for key, value in details.invocation_metadata or () if key == "authorization"]
        why = self._token.refusal(sent)
        if why is None:
            return handler

        def refuse(_behaviour: Any) -> Any:
            async def denied(_request: Any, context: grpc.aio.ServicerContext) -> None:
                await abort(context, SidecarError(ErrorKind.UNAUTHENTICATED, "UNAUTHENTICATED", why))

            return denied

        return _replace_behaviour(handler, refuse, _ignored)


def _ignored(_raw: bytes) -> None:
    """Decoder of refused calls: an unauthenticated caller's bytes cost no parsing."""
    return None


class AccessLogInterceptor(grpc.aio.ServerInterceptor):
    """One INFO line per unary request (method, code, duration), and request metrics."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = details.method
        # Health probes arrive every few seconds from orchestrators: keep the answered ones out of the INFO log.
        probe = method.startswith(_HEALTH_PREFIX)

        def wrap(behaviour: Any) -> Any:
            async def logged(request: Any, context: grpc.aio.ServicerContext) -> Any:
                started = time.perf_counter()

                def finished(code: Any) -> None:
                    code_name = _code_name(code)
                    elapsed = time.perf_counter() - started
                    metrics.REQUESTS.labels(method, code_name).inc()
                    metrics.LATENCY.labels(method).observe(elapsed)
                    level = logging.DEBUG if probe and code == grpc.StatusCode.OK else logging.INFO
                    log.log(level, "method=%s code=%s duration_ms=%.1f", method, code_name, elapsed * 1000)

                return await _observed(behaviour, request, context, finished)

            return logged

        return _replace_behaviour(handler, wrap)


class TracingInterceptor(grpc.aio.ServerInterceptor):
    """One OpenTelemetry server span per call to the sidecar's services, continuing the caller's traceparent.

    Installed outermost, and only while tracing is on: the access log line and every stage span fall inside it.
    Health probes and reflection are not traced."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None or not details.method.startswith("/ragsidecar."):
            return handler
        method, metadata = details.method, details.invocation_metadata

        def wrap(behaviour: Any) -> Any:
            async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
                with tracing.rpc_span(method, metadata) as finished:
                    return await _observed(behaviour, request, context, lambda code: finished(_code_name(code)))

            return traced

        return _replace_behaviour(handler, wrap)


async def _observed(
    behaviour: Any, request: Any, context: grpc.aio.ServicerContext, finished: Callable[[Any], None]
) -> Any:
    """Runs a call's behaviour, then hands `finished` the status it ended with (CANCELLED when the caller left)."""
    cancelled = False
    try:
        return await behaviour(request, context)
    except asyncio.CancelledError:
        cancelled = True
        raise
    finally:
        finished(grpc.StatusCode.CANCELLED if cancelled else context.code() or grpc.StatusCode.OK)


def _code_name(code: Any) -> str:
    return code.name if isinstance(code, grpc.StatusCode) else str(code)
