"""The HTTP API as an ASGI app: each request's JSON becomes the domain call the gRPC servicers make (reranking,
embedding), and the outcome becomes the JSON its API (Cohere, Jina, text-embeddings-inference, OpenAI) returns.

Every request goes through `_answered`: bearer token, body size, one access-log line and the request metrics, and
every error mapped once by http/http_errors.py. Decoding and encoding JSON cost what the body holds, so both run on a
worker thread; a client that hangs up cancels its call, so its queued model inputs never run.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ragsidecar import metrics, tracing
from ragsidecar.auth import BearerToken
from ragsidecar.embedding import Embedder, EmbedOutcome, EmbedQuery
from ragsidecar.errors import ErrorKind, SidecarError, Violation
from ragsidecar.http.body import JsonCaps, read_json_body
from ragsidecar.http.fields import Fields, decode_object
from ragsidecar.http.http_errors import (
    COHERE,
    OPENAI,
    TEI,
    Dialect,
    Fault,
    error_content,
    fault_of,
    headers_of,
    internal_fault,
    route_fault,
)
from ragsidecar.inference.registry import ModelRegistry
from ragsidecar.reranking import Candidate, Reranker, RerankOutcome, RerankQuery

log = logging.getLogger("ragsidecar.requests")

JSON = "application/json"
HEALTH = "/health"
# The metrics label of requests to no route: the path a caller sends must not become a label (unbounded).
UNMATCHED = "unmatched"
_SLASHES = re.compile("/{2,}")

# What an endpoint answers: status, headers and the JSON body.
Answer = tuple[int, dict[str, str], bytes]
Query = TypeVar("Query")
Outcome = TypeVar("Outcome")


@dataclass(frozen=True)
class Services:
    """What the HTTP API shares with the gRPC listener: the models, the reranker (its queue and result cache)."""

    registry: ModelRegistry
    reranker: Reranker
    embedder: Embedder
    token: BearerToken | None
    # What a request body may hold (bytes, items per array, string sizes), checked as it arrives.
    caps: JsonCaps
    # The sidecar's overall health, as the gRPC health service's "" entry says it.
    serving: Callable[[], bool]

    def authenticate(self, request: Request) -> None:
        if self.token is None:
            return
        why = self.token.refusal([value for key, value in request.scope["headers"] if key == b"authorization"])
        if why is not None:
            raise SidecarError(ErrorKind.UNAUTHENTICATED, "UNAUTHENTICATED", why)


@dataclass(frozen=True)
class JsonCall(Generic[Query, Outcome]):
    """A POST endpoint: its body read into a domain request, run, and the outcome written as its API does."""

    dialect: Dialect
    # JSON object -> domain request (on a worker thread; raises SidecarError for bad fields).
    read: Callable[[dict[str, Any]], Query]
    run: Callable[[Services, Query], Awaitable[Outcome]]
    # Domain request and outcome -> the JSON response (on a worker thread).
    write: Callable[[Query, Outcome], Any]


def build_app(services: Services) -> ASGIApp:
    cohere_v2 = JsonCall(COHERE, _read_rerank, _run_rerank, _rerank_writer("2"))
    openai_embeddings = JsonCall(OPENAI, _read_embeddings, _run_embeddings, _write_embeddings)
    routes = [
        _post(services, "/v2/rerank", cohere_v2),
        _post(services, "/v1/rerank", JsonCall(COHERE, _read_rerank, _run_rerank, _rerank_writer("1"))),
        # A client given the bare base URL for Cohere (LangChain4j, the AI SDK) posts here too: its body has
        # `documents` where TEI's has `texts`.
        _post(services, "/rerank", JsonCall(TEI, _read_tei_rerank, _run_rerank, _write_tei_rerank), cohere_v2),
        # OpenAI's SDKs take a base URL ending in /v1 and add /embeddings: the bare base reaches /embeddings.
        *(_post(services, path, openai_embeddings) for path in ("/v1/embeddings", "/embeddings")),
        *(Route(path, _models_endpoint(services, path), methods=["GET"]) for path in ("/v1/models", "/models")),
        Route(HEALTH, _health_endpoint(services), methods=["GET"]),
    ]
    known = {route.path for route in routes}
    served = "; ".join(f"{', '.join(sorted(route.methods or ()))} {route.path}" for route in routes)

    async def no_route(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        fault = route_fault(exc.status_code, f"{exc.detail}: this API serves {served}")
        path = request.url.path if request.url.path in known else UNMATCHED
        return await _answered(path, lambda: OPENAI, _refused(fault, dict(exc.headers or {})))

    return _one_slash(Starlette(routes=routes, exception_handlers={HTTPException: no_route}))


def _one_slash(app: ASGIApp) -> ASGIApp:
    """Paths with repeated slashes served as with one: a base URL ending in / gets a path starting with one
    (`http://host:8080/v1/` + `/rerank`)."""

    async def collapsed(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and "//" in scope["path"]:
            scope = {**scope, "path": _SLASHES.sub("/", scope["path"])}
        await app(scope, receive, send)

    return collapsed


def _post(services: Services, path: str, call: JsonCall, documents_call: JsonCall | None = None) -> Route:
    """A POST endpoint; with `documents_call`, a body holding `documents` and no `texts` is read, run and answered
    as that API's (errors found before the body is decoded are answered as `call`'s)."""

    async def endpoint(request: Request) -> Response:
        asked = [call]

        def read(body: bytearray) -> Any:
            value = decode_object(body)
            if documents_call is not None and "documents" in value and "texts" not in value:
                asked[0] = documents_call
            return asked[0].read(value)

        async def produce() -> Answer:
            services.authenticate(request)
            body = await read_json_body(request.stream(), request.headers.get("content-length", ""), services.caps)
            query = await asyncio.to_thread(read, body)
            chosen = asked[0]
            outcome = await _unless_disconnected(request, chosen.run(services, query))
            return 200, {}, await asyncio.to_thread(lambda: json.dumps(chosen.write(query, outcome)).encode())

        if not tracing.enabled():
            return await _answered(path, lambda: asked[0].dialect, produce)
        with tracing.http_span("POST", path, request.headers) as finished:
            response = await _answered(path, lambda: asked[0].dialect, produce)
            finished(response.status_code)
            return response

    return Route(path, endpoint, methods=["POST"])


def _models_endpoint(services: Services, path: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        async def produce() -> Answer:
            services.authenticate(request)
            data = [
                {
                    "id": s.spec.id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "ragsidecar",
                    "kind": s.spec.kind,
                    "state": s.state.value,
                    "default": s.is_default,
                    "max_input_tokens": s.spec.max_length,
                }
                for s in services.registry.statuses()
            ]
            return 200, {}, json.dumps({"object": "list", "data": data}).encode()

        return await _answered(path, lambda: OPENAI, produce)

    return endpoint


def _health_endpoint(services: Services) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(_request: Request) -> Response:
        async def produce() -> Answer:
            serving = services.serving()
            status = "SERVING" if serving else "NOT_SERVING"
            return (200 if serving else 503), {}, json.dumps({"status": status}).encode()

        return await _answered(HEALTH, lambda: OPENAI, produce)

    return endpoint


def _refused(fault: Fault, headers: dict[str, str]) -> Callable[[], Awaitable[Answer]]:
    async def produce() -> Answer:
        return fault.status, headers, error_content(fault, OPENAI)

    return produce


async def _answered(path: str, dialect: Callable[[], Dialect], produce: Callable[[], Awaitable[Answer]]) -> Response:
    """The response, with every error mapped once in the shape of the API the request was read as (`dialect`);
    one log line and the request metrics, as gRPC calls get."""
    started = time.perf_counter()
    status = 499  # until answered: a request cancelled under it counts as closed by the client (nginx's 499)
    try:
        try:
            status, headers, content = await produce()
        except SidecarError as err:
            fault = fault_of(err, dialect())
            status, headers, content = fault.status, headers_of(fault.status), error_content(fault, dialect())
        except ClientDisconnect:
            return Response(status_code=499)  # nobody reads it
        except Exception:
            log.exception("%s failed", path)
            fault = internal_fault()
            status, headers, content = fault.status, {}, error_content(fault, dialect())
        return Response(content, status, headers, media_type=JSON)
    finally:
        elapsed = time.perf_counter() - started
        metrics.REQUESTS.labels(path, str(status)).inc()
        metrics.LATENCY.labels(path).observe(elapsed)
        # Orchestrators probe health every few seconds: keep the answered probes out of the INFO log.
        level = logging.DEBUG if path == HEALTH and status == 200 else logging.INFO
        log.log(level, "method=%s code=%d duration_ms=%.1f", path, status, elapsed * 1000)


async def _unless_disconnected(request: Request, work: Awaitable[Outcome]) -> Outcome:
    """Runs the work while watching the connection: a client that hangs up cancels it (as a cancelled gRPC call
    is), so its model inputs still queued never run."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if task not in done:
        raise ClientDisconnect()
    return task.result()


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body is read by then, so only a disconnect can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# --- Rerank: Cohere v1/v2 and Jina (/v1/rerank, /v2/rerank) ---


@dataclass(frozen=True)
class RerankCall:
    query: RerankQuery
    return_documents: bool


def _read_rerank(body: dict[str, Any]) -> RerankCall:
    fields = Fields(body)
    model = fields.text("model") or ""
    query = fields.text("query", required=True) or ""
    texts = [_document_text(fields, i, document) for i, document in enumerate(fields.array("documents"))]
    top_n = fields.integer("top_n")
    max_tokens = fields.integer("max_tokens_per_doc")
    return_documents = fields.flag("return_documents", False)
    fields.done()
    candidates = [Candidate("", text or "") for text in texts]
    return RerankCall(RerankQuery(model, query, candidates, top_n, max_tokens), return_documents)


def _document_text(fields: Fields, index: int, document: Any) -> str | None:
    """A document is a string, or (Cohere v1, Jina) an object whose `text` is one."""
    where = f"documents[{index}]"
    if isinstance(document, dict):
        text = document.get("text")
        return text if fields.is_text(f"{where}.text", text) else None
    return document if fields.is_text(where, document) else None


async def _run_rerank(services: Services, call: RerankCall | TeiRerankCall) -> RerankOutcome:
    return await services.reranker.rerank(call.query, None)


def _rerank_writer(version: str) -> Callable[[RerankCall, RerankOutcome], Any]:
    def write(call: RerankCall, outcome: RerankOutcome) -> Any:
        results = []
        for ranked in outcome.results:
            result: dict[str, Any] = {"index": ranked.index, "relevance_score": ranked.relevance_score}
            if call.return_documents:
                result["document"] = {"text": ranked.candidate.text}
            results.append(result)
        tokens = outcome.input_tokens
        meta = {
            "api_version": {"version": version},
            "billed_units": {"search_units": search_units(len(call.query.documents))},
            "tokens": {"input_tokens": tokens, "output_tokens": 0},
        }
        return {
            "id": str(uuid.uuid4()),
            "model": outcome.model,
            "results": results,
            "meta": meta,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return write


def search_units(documents: int) -> int:
    """Cohere's billing unit: "one query with up to 100 documents to be ranked" (cohere.com/pricing)."""
    return max(1, math.ceil(documents / 100))


# --- Rerank: text-embeddings-inference (/rerank) ---


@dataclass(frozen=True)
class TeiRerankCall:
    query: RerankQuery
    raw_scores: bool
    return_text: bool


def _read_tei_rerank(body: dict[str, Any]) -> TeiRerankCall:
    fields = Fields(body)
    query = fields.text("query", required=True) or ""
    texts = [text if fields.is_text(f"texts[{i}]", text) else "" for i, text in enumerate(fields.array("texts"))]
    raw_scores = fields.flag("raw_scores", False)
    return_text = fields.flag("return_text", False)
    fields.done()
    return TeiRerankCall(RerankQuery("", query, [Candidate("", text) for text in texts]), raw_scores, return_text)


def _write_tei_rerank(call: TeiRerankCall, outcome: RerankOutcome) -> Any:
    results = []
    for ranked in outcome.results:
        result: dict[str, Any] = {
            "index": ranked.index,
            "score": ranked.raw_score if call.raw_scores else ranked.relevance_score,
        }
        if call.return_text:
            result["text"] = ranked.candidate.text
        results.append(result)
    return results


# --- Embeddings: OpenAI (/v1/embeddings) ---


@dataclass(frozen=True)
class EmbedCall:
    query: EmbedQuery
    as_base64: bool


def _read_embeddings(body: dict[str, Any]) -> EmbedCall:
    fields = Fields(body)
    model = fields.text("model") or ""
    texts = _input_texts(fields)
    encoding = fields.text("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        fields.problems.append(Violation("encoding_format", f'must be "float" or "base64", not {encoding!r}'))
    dimensions = fields.integer("dimensions")
    fields.done()
    return EmbedCall(EmbedQuery(model, texts, dimensions), encoding == "base64")


def _input_texts(fields: Fields) -> list[str]:
    """`input`: a string or an array of strings (token arrays are refused: the sidecar embeds text)."""
    value = fields.raw("input")
    if value is None:
        fields.problems.append(Violation("input", "required"))
        return []
    if not isinstance(value, list):
        return [value] if fields.is_text("input", value) else []
    if value and all(isinstance(item, (int, list)) and not isinstance(item, bool) for item in value):
        fields.problems.append(Violation("input", "token arrays are not supported: send the text"))
        return []
    return [text if fields.is_text(f"input[{i}]", text) else "" for i, text in enumerate(value)]


async def _run_embeddings(services: Services, call: EmbedCall) -> EmbedOutcome:
    return await services.embedder.embed(call.query, None)


def _write_embeddings(call: EmbedCall, outcome: EmbedOutcome) -> Any:
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(row, call.as_base64)}
        for i, row in enumerate(outcome.vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": outcome.model,
        "usage": {"prompt_tokens": outcome.tokens, "total_tokens": outcome.tokens},
    }


def _encoded(vector: np.ndarray, as_base64: bool) -> Any:
    """A float list, or OpenAI's base64 of the little-endian float32 bytes."""
    if as_base64:
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
