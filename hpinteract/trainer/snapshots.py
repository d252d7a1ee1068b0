"""In-memory snapshots of the model and optimizer, for DivergenceGuard's rollback.

Runs in: every rank's training thread, at sync points only, so all ranks snapshot (and
restore) the same steps. Kept only while a policy asks for them (``guard`` command): a
snapshot costs a copy of the model and optimizer state. A snapshot of step s holds the state
*before* step s ran, so it is good if the loss of every step from s on was.

Which snapshots are kept: the decision to roll back comes some steps after the divergence
(records travel to the coordinator, the policy decides, the command waits for a sync point),
and a plain ring of the newest few would by then hold only diverged states. So the ring is
exponential: of the snapshots numbered 0, 1, 2, ... it keeps, for each level l < ``keep``,
the newest whose number is a multiple of 2**l. That is at most ``keep`` copies reaching back
about 2**(keep-1) snapshots, with the newest ones densest. The rule depends only on the
snapshot numbers, so every rank keeps the same steps.
"""

from __future__ import annotations

import copy
from typing import Any


class Snapshots:
    def __init__(self, keep: int = 5) -> None:
        self.every = 0  # 0: off
        self._keep = keep
        self._taken = 0  # the number the next snapshot gets
        self._kept: dict[int, tuple[int, dict[str, Any]]] = {}  # number -> (step, state)

    def configure(self, every: int) -> None:
        self.every = max(0, int(every))
        if not self.every:
            self._kept.clear()
            self._taken = 0

    def maybe_take(self, step: int, model: Any, optimizer: Any, scheduler: Any) -> None:
        if not self.every or model is None:
            return
        steps = self.steps
        if steps and step - steps[-1] < self.every:
            return
        state = {"model": copy.deepcopy(model.state_dict()),
                 "optimizer": copy.deepcopy(optimizer.state_dict()) if optimizer else None,
                 "scheduler": copy.deepcopy(scheduler.state_dict()) if scheduler else None}
        n = self._taken
        self._taken += 1
        self._kept[n] = (step, state)
        wanted = {n >> level << level for level in range(self._keep)}
        for old in [k for k in self._kept if k not in wanted]:
            del self._kept[old]

    def restore(self, to_step: int, model: Any, optimizer: Any, scheduler: Any) -> int | None:
        """Load the newest snapshot taken at or before ``to_step``; its step, or None."""
        for n in sorted(self._kept, reverse=True):
            step, state = self._kept[n]
            if step > to_step:
                continue
            model.load_state_dict(state["model"])
            if optimizer is not None and state["optimizer"] is not None:
                optimizer.load_state_dict(state["optimizer"])
            if scheduler is not None and state["scheduler"] is not None:
                scheduler.load_state_dict(state["scheduler"])
            # Later snapshots may hold the diverged state, and older ones are superseded:
            # the restored one starts the numbering again, so it is kept longest.
            self._kept = {0: (step, state)}
            self._taken = 1
            return int(step)
        return None

    @property
    def steps(self) -> list[int]:
        return [self._kept[n][0] for n in sorted(self._kept)]
