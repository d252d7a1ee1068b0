"""Job states, shared by the job (which records them) and clients (which read them).

Runs in: every process.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    """Lifecycle of a job.

    Transitions::

        STARTING -> RUNNING            first training step began
        RUNNING  -> PAUSED -> RUNNING  pause / resume, at a step boundary on every rank
        RUNNING | PAUSED -> STOPPING   stop requested; every rank ends its loop at one step
        STARTING | RUNNING | PAUSED | STOPPING -> FINISHED   the script returned normally
        any non-terminal -> FAILING    rank 0 is ending after an error; which rank caused
                                       it is not known yet
        any non-terminal -> FAILED     a rank raised or died (the root cause recorded by the
                                       supervisor, which sees torchrun's exit statuses)

    FINISHED and FAILED are terminal.
    """

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPING = "stopping"
    FAILING = "failing"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (JobState.FINISHED, JobState.FAILED)

    def __str__(self) -> str:
        return self.value


# Which commands each state accepts; anything else is answered with InvalidState.
ALLOWED: dict[str, frozenset[JobState]] = {
    "set": frozenset({JobState.STARTING, JobState.RUNNING, JobState.PAUSED}),
    "pause": frozenset({JobState.STARTING, JobState.RUNNING}),
    "resume": frozenset({JobState.PAUSED}),
    "stop": frozenset({JobState.STARTING, JobState.RUNNING, JobState.PAUSED}),
    "checkpoint": frozenset({JobState.STARTING, JobState.RUNNING, JobState.PAUSED}),
}
