"""OpenTelemetry tracing, configured by the standard OTEL_* variables; off (and free) unless they ask for it.

Tracing is on when OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set or
OTEL_TRACES_EXPORTER is `otlp`, and neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none says
otherwise. Spans go out over OTLP/gRPC through a BatchSpanProcessor; the SDK itself reads the endpoint,
headers, timeouts, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and OTEL_TRACES_SAMPLER(_ARG).

The rest of the code calls the helpers below. With tracing off they return at once (a shared no-op context
manager, None for a context): no span, no attribute dictionary kept, no interceptor installed.

Spans are made on the event loop and on the threads of asyncio.to_thread (which copies the caller's
contextvars, and with them the current span). Work handed to the batching queue's workers carries its
context explicitly (`current()`), and its spans are recorded after the fact with their own times (`record`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

# Attribute names of the stage spans: the sidecar's own namespace.
PREFIX = "ragsidecar."
DEFAULT_SERVICE_NAME = "ragsidecar"

_tracer: Tracer | None = None
_provider: TracerProvider | None = None


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the OTEL_* variables turn tracing on."""
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or exporter == "none":
        return False
    endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return bool(endpoint) or exporter == "otlp"


def configure() -> bool:
    """Starts exporting spans when the process's variables ask for it (the SDK reads them from the process's
    environment too); returns whether tracing is on."""
    global _tracer, _provider
    environ = os.environ
    if _tracer is not None or not wanted(environ):
        return _tracer is not None
    # The SDK loads only when tracing is on.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from ragsidecar import __version__

    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create(
        {"service.version": __version__, **({} if named else {SERVICE_NAME: DEFAULT_SERVICE_NAME})}
    )
    _provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER(_ARG)
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _tracer = _provider.get_tracer("ragsidecar", __version__)
    log.info("tracing on: spans exported over OTLP/gRPC as service %s", resource.attributes.get(SERVICE_NAME))
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol != "grpc":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not offered: spans go out over OTLP/gRPC", protocol)
    return True


def shutdown() -> None:
    """Exports the spans still buffered (at most the exporter's timeout) and stops tracing."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def enabled() -> bool:
    return _tracer is not None


class _NoSpan:
    """The span of every stage while tracing is off: a reusable context manager that records nothing."""

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def set(self, **_attributes: Any) -> None:
        return None


_NO_SPAN = _NoSpan()


class _StageSpan:
    """A live span, with `set` for the attributes known only once the stage's work is done."""

    def __init__(self, span: Span) -> None:
        self._span = span

    def set(self, **attributes: Any) -> None:
        self._span.set_attributes(_named(attributes))


def span(name: str, **attributes: Any) -> Any:
    """A child span of the current one for a stage of the work (use in `with`; `.set(...)` adds attributes)."""
    if _tracer is None:
        return _NO_SPAN
    return _current_span(_tracer, name, attributes)


@contextmanager
def _current_span(tracer: Tracer, name: str, attributes: dict[str, Any]) -> Iterator[_StageSpan]:
    with tracer.start_as_current_span(name, attributes=_named(attributes)) as live:
        yield _StageSpan(live)


def _named(attributes: dict[str, Any]) -> dict[str, Any]:
    return {PREFIX + key: value for key, value in attributes.items() if value is not None}


def current() -> Context | None:
    """The caller's trace context, to carry with work that another task or thread does; None when off."""
    if _tracer is None:
        return None
    from opentelemetry import context

    return context.get_current()


def record(parent: Context | None, name: str, start_ns: int, end_ns: int, **attributes: Any) -> None:
    """A finished span under `parent` with the given wall-clock times (time.time_ns); nothing when parent is None."""
    if _tracer is None or parent is None:
        return
    _tracer.start_span(name, context=parent, start_time=start_ns, attributes=_named(attributes)).end(end_ns)


def distinct(contexts: Iterable[Context | None]) -> list[Context]:
    """The contexts of a batch's requests, each once (a request's inputs may fill several rows)."""
    seen: dict[int, Context] = {}
    for one in contexts:
        if one is not None:
            seen.setdefault(id(one), one)
    return list(seen.values())


# -- the RPC span ---------------------------------------------------------------------------------------------

# Server-side codes that mean the server failed (OpenTelemetry's gRPC conventions); the others are the caller's.
_SERVER_ERRORS = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"})


@contextmanager
def rpc_span(method: str, metadata: Iterable[tuple[str, Any]] | None) -> Iterator[Callable[[str], None]]:
    """The server span of one gRPC call, continuing the caller's W3C traceparent (and tracestate) when sent.

    Yields a function that takes the call's final status code name."""
    service, _, name = method.lstrip("/").rpartition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
    with _server_span(f"{service}/{name}", dict(metadata or ()), attributes) as live:

        def finished(code: str) -> None:
            live.set_attribute("rpc.grpc.status_code", code)
            if code in _SERVER_ERRORS:
                _failed(live, code)

        yield finished


@contextmanager
def http_span(method: str, route: str, headers: Mapping[str, str]) -> Iterator[Callable[[int], None]]:
    """The server span of one HTTP API request, continuing the caller's traceparent; yields a function that takes
    the response's status."""
    attributes = {"http.request.method": method, "http.route": route}
    with _server_span(f"{method} {route}", headers, attributes) as live:

        def finished(status: int) -> None:
            live.set_attribute("http.response.status_code", status)
            if status >= 500:
                _failed(live, str(status))

        yield finished


@contextmanager
def _server_span(name: str, headers: Mapping[str, Any], attributes: dict[str, str]) -> Iterator[Span]:
    assert _tracer is not None, "server spans are made only while tracing is on"
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {key: value for key in ("traceparent", "tracestate") if isinstance(value := headers.get(key), str)}
    parent = TraceContextTextMapPropagator().extract(carrier) if carrier else None
    with _tracer.start_as_current_span(
        name,
        context=parent,
        kind=SpanKind.SERVER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as live:
        yield live


def _failed(live: Span, description: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    live.set_status(Status(StatusCode.ERROR, description))


def log_ids() -> tuple[str, str] | None:
    """The current span's (trace_id, span_id) in hex, for log lines; None when there is none."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"
