"""In-memory snapshots of the model and optimizer, for DivergenceGuard's rollback.

Runs in: every rank's training thread, at sync points only, so all ranks snapshot (and
restore) the same steps. Kept only while a policy asks for them (``guard`` command): a
snapshot costs a copy of the model and optimizer state. A snapshot of step s holds the state
*before* step s ran, so it is good if the loss of every step from s on was.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any


class Snapshots:
    def __init__(self, keep: int = 3) -> None:
        self.every = 0  # 0: off
        self._ring: deque[tuple[int, dict[str, Any]]] = deque(maxlen=keep)

    def configure(self, every: int) -> None:
        self.every = max(0, int(every))
        if not self.every:
            self._ring.clear()

    def maybe_take(self, step: int, model: Any, optimizer: Any, scheduler: Any) -> None:
        if not self.every or model is None:
            return
        if self._ring and step - self._ring[-1][0] < self.every:
            return
        state = {"model": copy.deepcopy(model.state_dict()),
                 "optimizer": copy.deepcopy(optimizer.state_dict()) if optimizer else None,
                 "scheduler": copy.deepcopy(scheduler.state_dict()) if scheduler else None}
        self._ring.append((step, state))

    def restore(self, to_step: int, model: Any, optimizer: Any, scheduler: Any) -> int | None:
        """Load the newest snapshot taken at or before ``to_step``; its step, or None."""
        for step, state in reversed(self._ring):
            if step <= to_step:
                model.load_state_dict(state["model"])
                if optimizer is not None and state["optimizer"] is not None:
                    optimizer.load_state_dict(state["optimizer"])
                if scheduler is not None and state["scheduler"] is not None:
                    scheduler.load_state_dict(state["scheduler"])
                # Later snapshots may hold the diverged state: drop them.
                while self._ring and self._ring[-1][0] > step:
                    self._ring.pop()
                return int(step)
        return None

    @property
    def steps(self) -> list[int]:
        return [s for s, _ in self._ring]
