"""Maps domain errors to gRPC statuses carrying google.rpc details (ErrorInfo, BadRequest)."""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from ragsidecar.errors import ELLIPSIS, MAX_TEXT_BYTES, MAX_VIOLATIONS, ErrorKind, SidecarError, Violation, cut_text

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
# base64 grpc-status-details-bin), so both are bounded: at most 512 + 4608 * 4 / 3 = 6,656 bytes on the wire,
# whatever the request.
MAX_MESSAGE_WIRE_BYTES = 512
MAX_STATUS_BYTES = 4608
MAX_METADATA_ENTRIES = 8
_MAX_KEY_BYTES = 64
_FRAMING_BYTES = 16  # tags and lengths around each detail and its Any wrapper


def to_status(error: SidecarError) -> grpc.Status:
    message = _cut_message(error.message)
    metadata = _metadata_within_budget(error.metadata)
    # Room for the ErrorInfo as sent: with the count of left-out violations (and the line saying so).
    info = error_details_pb2.ErrorInfo(
        reason=error.reason, domain=ERROR_DOMAIN, metadata={**metadata, "omitted_violations": "999999"}
    )
    room = MAX_STATUS_BYTES - len(message.encode()) - info.ByteSize() - 4 * _FRAMING_BYTES - MAX_TEXT_BYTES
    violations, omitted = _violations_within(error.violations, room)
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
    status = status_pb2.Status(code=_CODES[error.kind].value[0], message=message, details=packed)
    return rpc_status.to_status(status)


def _violations_within(violations: list[Violation], room: int) -> tuple[list[Any], int]:
    """The first violations, each cut, that fit `room` bytes; then one saying how many were left out."""
    kept: list[Any] = []
    for violation in violations[:MAX_VIOLATIONS]:
        cut = error_details_pb2.BadRequest.FieldViolation(
            field=cut_text(violation.field, MAX_TEXT_BYTES), description=cut_text(violation.description, MAX_TEXT_BYTES)
        )
        room -= cut.ByteSize() + 4  # the tag and length that frame it
        if room < 0:
            break
        kept.append(cut)
    omitted = len(violations) - len(kept)
    if omitted:
        kept.append(
            error_details_pb2.BadRequest.FieldViolation(
                field="", description=f"{omitted} more violation{'s' if omitted > 1 else ''} not shown"
            )
        )
    return kept, omitted


def _metadata_within_budget(metadata: dict[str, str]) -> dict[str, str]:
    entries = list(metadata.items())[:MAX_METADATA_ENTRIES]
    return {cut_text(key, _MAX_KEY_BYTES): cut_text(value, MAX_TEXT_BYTES) for key, value in entries}


def _cut_message(message: str) -> str:
    """At most MAX_MESSAGE_WIRE_BYTES once percent-encoded as grpc-message is (bytes outside 0x20-0x7E and %)."""
    # A longer message costs more than the limit: each character is at least one byte.
    data = message[: MAX_MESSAGE_WIRE_BYTES + 1].encode("utf-8", "replace")
    costs = [1 if 0x20 <= byte <= 0x7E and byte != 0x25 else 3 for byte in data]
    if sum(costs) <= MAX_MESSAGE_WIRE_BYTES:
        return data.decode("utf-8")
    budget = MAX_MESSAGE_WIRE_BYTES - 3 * len(ELLIPSIS.encode())
    kept = sum(1 for used in itertools.accumulate(costs) if used <= budget)
    return data[:kept].decode("utf-8", "ignore") + ELLIPSIS


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
            status = to_status(err)
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("%s failed", method.__qualname__)
            status = rpc_status.to_status(
                status_pb2.Status(code=code_pb2.INTERNAL, message="internal error; see the sidecar's log")
            )
        # Aborting, not setting the code and returning: grpc.aio sends a unary method's return value, None
        # included (as an empty message), before a status set that way, and a client that takes the first message
        # as the answer would see a failed call succeed. The AbortError's reference cycle holds the request until a
        # full collection (inference/heap.py runs one as resident memory grows).
        await context.abort_with_status(status)

    return cast(Handler, wrapper)  # called as the servicer method it wraps, with its name (functools.wraps)


def deadline_of(context: grpc.aio.ServicerContext, now: float) -> float | None:
    """The call's deadline as an absolute event-loop time, or None when the caller set none."""
    remaining = context.time_remaining()
    return None if remaining is None else now + remaining
