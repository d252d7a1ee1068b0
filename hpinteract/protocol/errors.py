"""Typed errors, and their JSON form so that a job's error reaches the client unchanged.

Runs in: every process. An error raised on rank 0 while validating a command travels back
in the reply as ``{"type": ..., "message": ..., "field": ...}`` and is re-raised by the
client as the same class.
"""

from __future__ import annotations

from typing import Any


class HpiError(Exception):
    """Base class of every error hpinteract raises on purpose."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def to_wire(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "message": self.message, "field": self.field}


class InvalidHParam(HpiError, ValueError):
    """A hyper-parameter name or value was rejected; ``field`` names it."""


class InvalidState(HpiError):
    """The command is not allowed in the job's current state (e.g. resume while running)."""


class InvalidCommand(HpiError):
    """A request the coordinator does not understand (unknown type, malformed content)."""


class AuthError(HpiError):
    """A message was unsigned, forged, replayed or stale; it was not acted on.

    ``signed``: its signature was good (a replayed or stale message): its sender holds
    the key, so it is told why, however many there are."""

    def __init__(self, message: str, *, field: str | None = None,
                 signed: bool = False) -> None:
        super().__init__(message, field=field)
        self.signed = signed


class ProtocolError(HpiError):
    """A message that is signed but malformed, or of another protocol version."""


class JobNotFound(HpiError, LookupError):
    """No run directory matches the job id given."""


class JobFailed(HpiError):
    """The job failed; ``rank`` names the root-cause rank when known."""

    def __init__(self, message: str, *, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank

    def to_wire(self) -> dict[str, Any]:
        return {**super().to_wire(), "rank": self.rank}


class HpiTimeout(HpiError, TimeoutError):
    """The job did not answer in time (it may be busy, gone, or unreachable)."""


class ConfigError(HpiError, ValueError):
    """Wrong use of the training-side API (e.g. a batch size that ranks cannot share)."""


class CheckpointError(HpiError):
    """A checkpoint could not be written or read; the job trains on."""


_BY_NAME: dict[str, type[HpiError]] = {
    cls.__name__: cls
    for cls in (
        HpiError,
        InvalidHParam,
        InvalidState,
        InvalidCommand,
        AuthError,
        ProtocolError,
        JobNotFound,
        JobFailed,
        HpiTimeout,
        ConfigError,
        CheckpointError,
    )
}


def error_from_wire(data: dict[str, Any]) -> HpiError:
    """Rebuild the typed error a job sent; unknown names degrade to ``HpiError``."""
    cls = _BY_NAME.get(str(data.get("type")), HpiError)
    message = str(data.get("message", "unknown error"))
    if cls is JobFailed:
        rank = data.get("rank")
        return JobFailed(message, rank=int(rank) if isinstance(rank, int) else None)
    field = data.get("field")
    return cls(message, field=str(field) if field is not None else None)
