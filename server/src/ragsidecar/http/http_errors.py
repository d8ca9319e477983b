"""Maps domain errors to HTTP statuses and to the error body each API's clients read: the one place, as
api/grpc_errors.py is for gRPC.

The status follows Google's HTTP mapping of the gRPC codes, with two refinements every API here shares: a size
limit (LIMIT_EXCEEDED) is 413, and a refused request is the status its API documents (OpenAI and Cohere: 400;
text-embeddings-inference: 422). A full queue (429) and a model still warming up (503) say when to retry. Every
body carries the sidecar's stable `reason` and its field `violations`, bounded as the gRPC details are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ragsidecar.errors import MAX_TEXT_BYTES, MAX_VIOLATIONS, ErrorKind, SidecarError, Violation, cut_text
from ragsidecar.reranking import LIMIT_EXCEEDED

MAX_MESSAGE_BYTES = 512
# Seconds a client should wait before retrying a full queue or a model that is still loading.
RETRY_AFTER_S = 1

_STATUS_OF_KIND = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.FAILED_PRECONDITION: 400,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.PERMISSION_DENIED: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.RESOURCE_EXHAUSTED: 429,
    ErrorKind.CANCELLED: 499,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.DEADLINE_EXCEEDED: 504,
}


@dataclass(frozen=True)
class Fault:
    """An error as an API answers it: status, message, stable reason and field violations."""

    status: int
    message: str
    reason: str
    violations: list[dict[str, str]]


@dataclass(frozen=True)
class Dialect:
    """One API's way of refusing a request."""

    name: str
    # The status of a request this API cannot accept (malformed, or a field out of range).
    invalid_status: int
    body: Callable[[Fault], dict[str, Any]]
    # The domain's field names (as gRPC's) and what this API's callers write instead, applied to errors in order.
    renames: tuple[tuple[re.Pattern[str], str], ...] = ()

    def renamed(self, text: str) -> str:
        for pattern, name in self.renames:
            text = pattern.sub(name, text)
        return text


def _openai_body(fault: Fault) -> dict[str, Any]:
    kinds = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
    kind = kinds.get(fault.status, "server_error" if fault.status >= 500 else "invalid_request_error")
    param = fault.violations[0]["field"] if fault.violations else None
    return {
        "error": {
            "message": fault.message,
            "type": kind,
            "param": param,
            "code": fault.reason,
            "violations": fault.violations,
        }
    }


def _rerank_body(fault: Fault) -> dict[str, Any]:
    # Cohere's clients read `message`; Jina's (and FastAPI-style ones) read `detail`.
    return {"message": fault.message, "detail": fault.message, "reason": fault.reason, "violations": fault.violations}


def _tei_body(fault: Fault) -> dict[str, Any]:
    kinds = {401: "Unauthorized", 429: "Overloaded", 503: "Unhealthy"}
    kind = kinds.get(fault.status, "Backend" if fault.status >= 500 else "Validation")
    return {"error": fault.message, "error_type": kind, "reason": fault.reason, "violations": fault.violations}


OPENAI = Dialect("openai", 400, _openai_body)
COHERE = Dialect("cohere", 400, _rerank_body, ((re.compile(r"\bmax_document_tokens\b"), "max_tokens_per_doc"),))
TEI = Dialect(
    "tei",
    422,
    _tei_body,
    ((re.compile(r"\bdocuments\[(\d+)\]\.text\b"), r"texts[\1]"), (re.compile(r"\bdocuments\b"), "texts")),
)


def status_of(error: SidecarError, dialect: Dialect) -> int:
    if error.reason == LIMIT_EXCEEDED:
        return 413
    if error.kind == ErrorKind.INVALID_ARGUMENT:
        return dialect.invalid_status
    return _STATUS_OF_KIND[error.kind]


def headers_of(status: int) -> dict[str, str]:
    if status in (429, 503):
        return {"retry-after": str(RETRY_AFTER_S)}
    if status == 401:
        return {"www-authenticate": "Bearer"}
    return {}


def fault_of(error: SidecarError, dialect: Dialect) -> Fault:
    """The error as the API answers it, its fields named as the API's callers write them."""
    message = cut_text(dialect.renamed(error.message), MAX_MESSAGE_BYTES)
    violations = [
        Violation(dialect.renamed(v.field), dialect.renamed(v.description), v.reason) for v in error.violations
    ]
    return Fault(status_of(error, dialect), message, error.reason, _bounded(violations))


def internal_fault() -> Fault:
    """A defect in the sidecar (never bad input): its details stay in the log."""
    return Fault(500, "internal error; see the sidecar's log", "INTERNAL", [])


def route_fault(status: int, message: str) -> Fault:
    """No such path (404), or a method the path does not take (405)."""
    return Fault(status, message, "INVALID_REQUEST", [])


def error_content(fault: Fault, dialect: Dialect) -> bytes:
    return json.dumps(dialect.body(fault)).encode()


def _bounded(violations: list[Violation]) -> list[dict[str, str]]:
    """The first violations, each cut, then one saying how many were left out."""
    kept = [
        {"field": cut_text(v.field, MAX_TEXT_BYTES), "description": cut_text(v.description, MAX_TEXT_BYTES)}
        for v in violations[:MAX_VIOLATIONS]
    ]
    omitted = len(violations) - len(kept)
    if omitted:
        kept.append({"field": "", "description": f"{omitted} more violation{'s' if omitted > 1 else ''} not shown"})
    return kept
