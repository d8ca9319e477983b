"""Maps domain errors to gRPC statuses carrying google.rpc details (ErrorInfo, BadRequest)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from ragsidecar.errors import ErrorKind, SidecarError

log = logging.getLogger(__name__)

ERROR_DOMAIN = "ragsidecar.dev"

_CODES: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
}


# gRPC clients drop a response whose headers pass 8 KiB (some 16 KiB), and then report "Stream removed"
# instead of the status. The message travels twice (percent-encoded in grpc-message, and inside the
# base64 grpc-status-details-bin), so both are cut: about 5.5 KiB on the wire at most, whatever the request.
MAX_MESSAGE_WIRE_BYTES = 512
MAX_DETAILS_BYTES = 3072
MAX_VIOLATIONS = 20
MAX_TEXT_BYTES = 200
MAX_METADATA_ENTRIES = 8
_ELLIPSIS = "…"


def to_status(error: SidecarError) -> grpc.Status:
    code = _CODES[error.kind]
    violations, omitted = _violations_within_budget(error)
    metadata = _metadata_within_budget(error.metadata)
    if omitted:
        metadata["omitted_violations"] = str(omitted)
    details: list[Any] = [error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN, metadata=metadata)]
    if violations:
        details.append(error_details_pb2.BadRequest(field_violations=violations))
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    status = status_pb2.Status(code=code.value[0], message=_cut_message(error.message), details=packed)
    return rpc_status.to_status(status)


def _violations_within_budget(error: SidecarError) -> tuple[list[Any], int]:
    """The first violations that fit the details budget, each cut; and how many were left out."""
    kept: list[Any] = []
    used = 0
    for violation in error.violations[:MAX_VIOLATIONS]:
        cut = error_details_pb2.BadRequest.FieldViolation(field=cut_text(violation.field, MAX_TEXT_BYTES),
                                                          description=cut_text(violation.description,
                                                                               MAX_TEXT_BYTES))
        used += cut.ByteSize() + 4  # the tag and length that frame it
        if used > MAX_DETAILS_BYTES - 2 * MAX_TEXT_BYTES:  # room left for the ErrorInfo and the count of the rest
            break
        kept.append(cut)
    omitted = len(error.violations) - len(kept)
    if omitted:
        kept.append(error_details_pb2.BadRequest.FieldViolation(
            field="", description=f"{omitted} more violation{'s' if omitted > 1 else ''} not shown"))
    return kept, omitted


def _metadata_within_budget(metadata: dict[str, str]) -> dict[str, str]:
    entries = list(metadata.items())[:MAX_METADATA_ENTRIES]
    return {cut_text(key, 64): cut_text(value, MAX_TEXT_BYTES) for key, value in entries}


def cut_text(text: str, limit: int) -> str:
    """At most `limit` UTF-8 bytes, cut on a character boundary and marked when cut; always valid UTF-8."""
    data = text[:limit + 1].encode("utf-8", "replace")
    if len(data) <= limit:
        return data.decode("utf-8")
    return data[:limit - len(_ELLIPSIS.encode())].decode("utf-8", "ignore") + _ELLIPSIS


def _cut_message(message: str) -> str:
    """At most MAX_MESSAGE_WIRE_BYTES once percent-encoded as grpc-message is (bytes outside 0x20-0x7E and %)."""
    # A longer message costs more than the limit: each character is at least one byte.
    data = message[:MAX_MESSAGE_WIRE_BYTES + 1].encode("utf-8", "replace")
    costs = [1 if 0x20 <= byte <= 0x7E and byte != 0x25 else 3 for byte in data]
    if sum(costs) <= MAX_MESSAGE_WIRE_BYTES:
        return data.decode("utf-8")
    budget, used = MAX_MESSAGE_WIRE_BYTES - 3 * len(_ELLIPSIS.encode()), 0
    for position, cost in enumerate(costs):
        used += cost
        if used > budget:
            return data[:position].decode("utf-8", "ignore") + _ELLIPSIS
    return data.decode("utf-8")  # unreachable: the costs sum past the budget


async def abort(context: grpc.aio.ServicerContext, error: SidecarError) -> None:
    await context.abort_with_status(to_status(error))


Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def translates_errors(method: Handler) -> Handler:
    """Decorates a servicer method: domain errors become statuses with details; bugs become INTERNAL."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except SidecarError as err:
            await abort(context, err)
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("%s failed", method.__qualname__)
            status = status_pb2.Status(code=code_pb2.INTERNAL, message="internal error; see the sidecar's log")
            await context.abort_with_status(rpc_status.to_status(status))

    return wrapper  # type: ignore[return-value]


def deadline_of(context: grpc.aio.ServicerContext, now: float) -> float | None:
    """The call's deadline as an absolute event-loop time, or None when the caller set none."""
    remaining = context.time_remaining()
    return None if remaining is None else now + remaining
