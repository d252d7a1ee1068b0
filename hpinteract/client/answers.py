"""What a job answers a client: the acknowledgement of a command, and why a job failed.

Runs in: client processes (made by ``Job``; ``hpi.Ack`` and ``hpi.JobError`` to users).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..protocol.failures import summary


@dataclass(frozen=True)
class Ack:
    """The job's answer to a command: the change's id and the first step that used it."""

    change_id: str
    applied_at_step: int
    values: dict[str, Any]
    state: str | None = None
    path: str | None = None  # the file a checkpoint was written to


@dataclass(frozen=True)
class JobError:
    """Why a job failed: the root-cause rank (None where no rank is to blame: the launch
    failed, or the ranks saw only a lost peer), what happened to it, and what the other
    ranks' failures were (``consequences``: each a dict of rank, kind, message, exitcode,
    signal). ``kind`` is one of ``exception``, ``hang``, ``signal``, ``exit``, ``stopped``,
    ``lost_peer``."""

    rank: int | None
    message: str
    exitcode: int | None = None
    traceback: str | None = None
    signal: str | None = None  # e.g. "SIGKILL", for a rank killed by a signal
    step: int | None = None  # the step the rank was in
    kind: str | None = None
    consequences: tuple[dict[str, Any], ...] = ()
    exception: str | None = None  # the exception's type, for kind "exception"

    @classmethod
    def from_record(cls, err: dict[str, Any]) -> JobError:
        """From the error the supervisor recorded (protocol/failures.py's ``cause``)."""
        return cls(err.get("rank"), str(err.get("message", "")), err.get("exitcode"),
                   err.get("traceback"), err.get("signal"), err.get("step"), err.get("kind"),
                   tuple(c for c in err.get("consequences") or () if isinstance(c, dict)),
                   err.get("type"))

    def __str__(self) -> str:
        return summary({"rank": self.rank, "message": self.message, "kind": self.kind,
                        "type": self.exception, "consequences": self.consequences})
