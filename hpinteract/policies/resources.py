"""A resource policy: add ranks while throughput scales (after KungFu's).

Runs in: whichever process hosts it (rank 0's coordinator when added by name, or a
client). Torch-free: it reads ``samples_per_s`` from the metric records and returns
``workers`` changes, which resize the job through the usual path (trainer/resize.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from ..protocol.errors import InvalidCommand
from .base import Change, Context, Policy
from .schedules import check_float, check_int, number


class ScaleWorkers(Policy):
    """Multiply the ranks by ``factor`` while each step up raises the samples a second by at
    least ``min_gain`` (a fraction), up to ``max_workers``; a step up that does not pay is
    undone, and the policy rests. Each size is measured on the median of ``window`` steps,
    after ``settle`` steps of its own (a restarted job warms up)."""

    name = "scale_workers"
    drives = ("workers",)

    def __init__(self, max_workers: Any, min_gain: Any = 0.1, window: Any = 30,
                 settle: Any = 10, factor: Any = 2) -> None:
        self.max_workers = check_int("max_workers", max_workers, low=1)
        self.min_gain = check_float("min_gain", min_gain, low=0.0)
        self.window = check_int("window", window, low=3)
        self.settle = check_int("settle", settle, low=0)
        self.factor = check_int("factor", factor, low=2)
        self._before: tuple[int, float] | None = None  # the size and rate before a step up
        self._resting = False

    def on_step(self, ctx: Context) -> Change | None:
        workers = ctx.hparams.get("workers")
        if self._resting or not isinstance(workers, int):
            return None
        start = (ctx.applied_at or 0) + self.settle  # records of this size, warmed up
        rates = [v for r in ctx.history if int(r.get("step", -1)) >= start
                 and (v := number(r.get("samples_per_s"))) is not None and v > 0]
        if len(rates) < self.window:
            return None
        rate = statistics.median(rates[-self.window:])
        if self._before is not None and workers > self._before[0]:
            size, was = self._before
            if rate < was * (1 + self.min_gain):
                self._resting, self._before = True, None
                return Change({"workers": size}, reason=(
                    f"{workers} ranks: {rate:.4g} samples/s, not {1 + self.min_gain:g}x the "
                    f"{was:.4g} of {size}: back to {size}"))
        bigger = workers * self.factor
        if bigger > self.max_workers:
            self._resting = True
            return None
        self._before = (workers, rate)
        return Change({"workers": bigger}, reason=(
            f"{workers} ranks: {rate:.4g} samples/s; trying {bigger}"))

    def state_dict(self) -> dict[str, Any]:
        return {"before": list(self._before) if self._before else None,
                "resting": self._resting}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        before = state.get("before")
        if before is not None and (not isinstance(before, list | tuple) or len(before) != 2):
            raise InvalidCommand(f"scale_workers: bad saved state {before!r}")
        self._before = (int(before[0]), float(before[1])) if before else None
        self._resting = bool(state.get("resting", False))
