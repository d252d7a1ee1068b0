"""What a job answers a client: the acknowledgement of a command, and why a job failed.

Runs in: client processes (made by ``Job``; ``hpi.Ack`` and ``hpi.JobError`` to users).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    """Why a job failed: the root-cause rank (None if no rank ran) and its error."""

    rank: int | None
    message: str
    exitcode: int | None = None
    traceback: str | None = None

    def __str__(self) -> str:
        where = f"rank {self.rank}" if self.rank is not None else "the launcher"
        code = f" (exit code {self.exitcode})" if self.exitcode is not None else ""
        return f"{where} failed{code}: {self.message}"
