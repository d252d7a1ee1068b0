"""What a framework drives itself in a Run: the batch plan, checkpoints, and changes that
can only take effect at an epoch boundary.

Runs in: every rank's training thread. A raw loop has none of this (``Run.driven`` is
None); a framework integration (hpinteract.integrations) sets one before the first step.
The framework, not hpinteract, owns the loader, the gradient accumulation and the
checkpoint files, so the Run asks it through these hooks instead of doing them itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .commands import Command

# (micro-batch per rank, accumulation steps) for the current values.
Plan = Callable[[Mapping[str, Any]], tuple[int, int]]
# Every rank, at the step boundary that agreed on it: write the framework's own checkpoint.
# Rank 0 gets the command to answer (None on the others) and answers it once it is on disk.
Save = Callable[[Command | None, int], None]


@dataclass
class Driven:
    name: str  # "lightning", "transformers": shown in the job's status
    plan: Plan
    save: Save
    # Names whose change the framework takes only at an epoch boundary: a set of any of
    # them waits there (on rank 0, before the collective), and is acknowledged with the
    # step it took effect at.
    at_epoch: frozenset[str] = frozenset()
    progress: Callable[[], float | None] | None = None  # the share of training done
    # The global batch's unit and its reason (batching.BatchStep), e.g. Lightning's
    # samples per rank and forward times the ranks: accumulation makes the rest.
    batch_step: dict[str, Any] | None = None
    lr_used: float | None = None  # the lr of the step just taken, noted before the scheduler's
    # Rank 0 posts the step's held record (Run.held_record) now: the job is pausing.
    flush: Callable[[], None] | None = None
    held: list[Command] = field(default_factory=list)  # rank 0: waiting for the boundary
    releasing: bool = False  # this sync point is an epoch boundary
    # Every change applied in this run, with its step (every rank alike): a framework
    # checkpoint carries them, so a job resumed from it keeps the history.
    changes: list[dict[str, Any]] = field(default_factory=list)

    def gate(self, cmds: list[Command]) -> list[Command]:
        """Rank 0: the commands that go out at this sync point (the rest wait, in order)."""
        if self.releasing:
            out, self.held = [*self.held, *cmds], []
            return out
        if not self.at_epoch or not cmds:
            return cmds
        now: list[Command] = []
        for c in cmds:
            waits = c.op == "set" and bool(self.at_epoch & c.values.keys())
            (self.held if waits else now).append(c)
        return now


def release_at_epoch(run: Any) -> None:
    """Every rank, at an epoch boundary the framework reached on all of them: a sync point
    out of turn at which the changes held for the boundary go out (rank 0) and apply."""
    driven = run.driven
    assert driven is not None
    driven.releasing = True
    try:
        run._sync_now()
    finally:
        driven.releasing = False
    run.hold_while_paused()  # a pause that came with the boundary holds there
