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


def to_status(error: SidecarError) -> grpc.Status:
    code = _CODES[error.kind]
    details = [error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata)]
    if error.violations:
        details.append(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in error.violations]))
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    status = status_pb2.Status(code=code.value[0], message=error.message, details=packed)
    return rpc_status.to_status(status)


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
