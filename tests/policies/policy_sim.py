"""A scripted job for the policies' tests: a PolicySet fed records the way a job's host
feeds it, with each decision applied at a later step boundary."""

from __future__ import annotations

from typing import Any

from hpinteract.policies import Change, Policy, PolicySet
from hpinteract.policies.host import Decision


class Sim:
    """A scripted job. Decisions made while observing step s take effect at the boundary
    before step s + delay (an add's decision at the next boundary), as the job applies them."""

    def __init__(self, *policies: Policy, hparams: dict[str, Any] | None = None,
                 world_size: int = 1, delay: int = 1, every: int = 1) -> None:
        self.ps = PolicySet(world_size=world_size)
        self.hp: dict[str, Any] = {"lr": 0.1, "batch_size": 32, "monitor_gns": 1,
                                   **(hparams or {})}
        self.ps.observe_status(self.hp)
        self.step, self.delay = 0, delay
        self.pending: list[tuple[int, Decision]] = []
        self.applied: list[tuple[int, str, Change]] = []  # (step it took effect, policy, change)
        for p in policies:
            self._queue(self.ps.add(p, every=every), self.step + delay - 1)

    def _queue(self, decisions: list[Decision], due: int) -> None:
        self.pending += [(due, d) for d in decisions]

    def apply_due(self) -> None:
        due = [d for s, d in self.pending if s <= self.step]
        self.pending = [(s, d) for s, d in self.pending if s > self.step]
        for d in due:
            self.hp.update(d.change.values)
            self.ps.on_applied(d.change.values, d.source, self.step)
            self.applied.append((self.step, d.name, d.change))

    def train(self, n: int, **fields: Any) -> None:
        for _ in range(n):
            self.apply_due()
            rec = {"step": self.step, "epoch": 0, "lr": self.hp["lr"],
                   "batch_size": self.hp["batch_size"]}
            for k, v in fields.items():
                value = v(self.step) if callable(v) else v
                if value is not None:
                    rec[k] = value
            self._queue(self.ps.observe([rec]), self.step + self.delay)
            self.step += 1

    def evaluate(self, **values: Any) -> None:
        """An evaluation after the last step trained."""
        self._queue(self.ps.observe([{"step": self.step - 1, "eval": True, **values}]),
                    self.step + self.delay - 1)

    def set(self, **values: Any) -> None:
        """A person's change at the current boundary (after what is due there)."""
        self.apply_due()
        self.hp.update(values)
        self.ps.on_applied(values, "user", self.step)

    def system(self, source: str, **values: Any) -> None:
        """A change the job makes itself (lr_scaling, resume) at the current boundary."""
        self.apply_due()
        self.hp.update(values)
        self.ps.on_applied(values, source, self.step)

    def changes(self, key: str) -> list[tuple[int, Any]]:
        return [(s, c.values[key]) for s, _, c in self.applied if key in c.values]

    def actions(self) -> list[tuple[str | None, int | None]]:
        return [(c.action, c.to_step) for _, _, c in self.applied if c.action]

    def notices(self, status: str) -> list[dict[str, Any]]:
        return [n for n in self.ps.notices if n["status"] == status]
