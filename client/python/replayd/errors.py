"""Errors: every failure of a call raises a `replayd.Error` subclass named after its gRPC code.

Each carries `code` (a `grpc.StatusCode`) and `message` (the daemon's message, which names
the thing that was wrong and the value that made it wrong). A failed request changes nothing
on the daemon. Arguments the client can check before sending raise the same classes
(`InvalidArgument` for a wrong dtype or shape, `NotFound` for a session this client has
closed, as the daemon answers for one closed elsewhere), so one `except` clause covers
both. `InvalidArgument` is also a `ValueError`.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc

__all__ = [
    "Error", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
    "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
    "from_number", "from_rpc_error", "from_status",
]


class Error(Exception):
    """A failed replayd call: `code` is the gRPC status code, `message` the daemon's text."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class Cancelled(Error):
    code = grpc.StatusCode.CANCELLED


class Unknown(Error):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(Error, ValueError):
    """A malformed request, a value out of range, a compile error (the message carries the
    compiler's diagnostics), or an argument of the wrong dtype or shape."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(Error):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(Error):
    """An unknown handle, one of another session, or anything of a closed session."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(Error):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(Error):
    """A device or program format outside the tenant's policy."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(Error):
    """Device memory, a tenant quota, or no worker free on the daemon (worth a retry)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(Error):
    """The wrong state: a replay while capturing, a session whose device context was lost."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(Error):
    """A stream operation not run because an earlier one on the session's stream failed."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(Error):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(Error):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(Error):
    """A bug, in the daemon or in what it answered."""

    code = grpc.StatusCode.INTERNAL


class Unavailable(Error):
    """No daemon at the address, one shutting down, or a broken connection."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(Error):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(Error):
    """No token, or one the daemon's tenants file does not know."""

    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: Dict[grpc.StatusCode, Type[Error]] = {
    cls.code: cls
    for cls in (Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
                PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
                Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)
}
_BY_NUMBER: Dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def from_status(code: grpc.StatusCode, message: str) -> Error:
    """The Error subclass for `code`, carrying `message`."""
    return _BY_CODE.get(code, Unknown)(message, code)


def from_number(number: int, message: str) -> Error:
    """The Error for a numeric status code, as a Session stream reply carries it."""
    return from_status(_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN), message)


def from_rpc_error(error: grpc.RpcError) -> Error:
    """The Error for a failed gRPC call."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return from_status(code or grpc.StatusCode.UNKNOWN, details or "")
