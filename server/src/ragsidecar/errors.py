"""Domain errors: what went wrong, in terms the API layer maps to gRPC status codes and details.

The domain raises these and knows nothing of gRPC; `api.grpc_errors` turns each kind into a status code
with a google.rpc.ErrorInfo (reason) and, for violations, a google.rpc.BadRequest, and `http.http_errors` into
each HTTP API's error shape. Both transports bound what they repeat of an error by the limits here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# What either transport repeats of an error: at most this many violations, each text at most this many bytes.
MAX_VIOLATIONS = 20
MAX_TEXT_BYTES = 200
ELLIPSIS = "…"


def cut_text(text: str, limit: int) -> str:
    """At most `limit` UTF-8 bytes, cut on a character boundary and marked when cut; always valid UTF-8."""
    data = text[: limit + 1].encode("utf-8", "replace")
    if len(data) <= limit:
        return data.decode("utf-8")
    return data[: limit - len(ELLIPSIS.encode())].decode("utf-8", "ignore") + ELLIPSIS


class ErrorKind(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    FAILED_PRECONDITION = "failed_precondition"
    PERMISSION_DENIED = "permission_denied"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    UNAVAILABLE = "unavailable"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    UNAUTHENTICATED = "unauthenticated"


@dataclass(frozen=True)
class Violation:
    """One problem with one field of a request."""

    field: str
    description: str
    # Stable reason of this one problem (an ErrorReason name), where a response lists violations.
    reason: str = "INVALID_CONFIGURATION"


@dataclass
class SidecarError(Exception):
    kind: ErrorKind
    # Stable reason, one of the ErrorReason names of common.proto without its prefix.
    reason: str
    message: str
    violations: list[Violation] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


# The message names the first few problems; the status details list more (api.grpc_errors bounds both).
_SUMMARIZED_VIOLATIONS = 3


def invalid(violations: list[Violation], reason: str = "INVALID_REQUEST") -> SidecarError:
    summary = "; ".join(f"{v.field}: {v.description}" for v in violations[:_SUMMARIZED_VIOLATIONS])
    rest = len(violations) - _SUMMARIZED_VIOLATIONS
    if rest > 0:
        summary += f"; and {rest} more"
    return SidecarError(ErrorKind.INVALID_ARGUMENT, reason, summary, violations)


def unknown_model(model: str, known: list[str]) -> SidecarError:
    return SidecarError(
        ErrorKind.NOT_FOUND,
        "UNKNOWN_MODEL",
        f"model {model!r} is not configured (configured: {', '.join(known) or 'none'})",
        metadata={"model": model},
    )


def model_not_ready(model: str, why: str) -> SidecarError:
    return SidecarError(
        ErrorKind.UNAVAILABLE, "MODEL_NOT_READY", f"model {model!r} is not ready: {why}", metadata={"model": model}
    )


def warming_up(model: str) -> SidecarError:
    """The sidecar has not finished loading its models since it started: transient, unlike a model that failed."""
    return SidecarError(
        ErrorKind.UNAVAILABLE,
        "WARMING_UP",
        f"the sidecar is warming up: model {model!r} is still loading; retry shortly",
        metadata={"model": model},
    )


def queue_full(model: str, limit: int) -> SidecarError:
    return SidecarError(
        ErrorKind.RESOURCE_EXHAUSTED,
        "QUEUE_FULL",
        f"the inference queue of {model!r} is full ({limit} pairs); retry later",
        metadata={"model": model, "max_queued_pairs": str(limit)},
    )


def deadline_exceeded(what: str) -> SidecarError:
    return SidecarError(ErrorKind.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", f"deadline passed before {what}")
