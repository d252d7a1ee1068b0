"""Policies that watch one metric for a lack of improvement: ReduceOnPlateau lowers lr,
EarlyStopping stops the job.

Runs in: whichever process hosts it: rank 0's coordinator for built-ins, or a client.
Torch-free: it reads the plain numbers of metric records and returns changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..protocol.errors import InvalidCommand
from .base import Change, Context, Policy
from .schedules import check_choice, check_float, check_int, number


class _MetricWatch(Policy):
    """Checks a metric: on each evaluation that reports it, else on the mean of the training
    records since the previous check."""

    def __init__(self, metric: Any, mode: Any, patience: Any) -> None:
        if not isinstance(metric, str) or not metric:
            raise InvalidCommand(f"metric must be a metric name, got {metric!r}", field="metric")
        self.metric = metric
        self.mode = check_choice("mode", mode, ("min", "max"))
        self.patience = check_int("patience", patience, low=1)
        self._best: float | None = None
        self._bad = 0  # checks in a row without improvement
        self._last: int | None = None  # the step of the newest record checked
        self._from_evals = False  # once evaluations report the metric, only they count

    def _improved(self, value: float, best: float) -> bool:
        raise NotImplementedError

    def _check(self, ctx: Context, value: float) -> Change | None:
        raise NotImplementedError

    def _observe(self, value: float) -> None:
        if self._best is None or self._improved(value, self._best):
            self._best, self._bad = value, 0
        else:
            self._bad += 1

    def on_eval(self, ctx: Context) -> Change | None:
        value = number(ctx.evals[-1].get(self.metric)) if ctx.evals else None
        if value is None:
            return None
        self._from_evals = True
        return self._check(ctx, value)

    def on_step(self, ctx: Context) -> Change | None:
        if self._from_evals:
            return None
        new = [r for r in ctx.history if self._last is None or r.get("step", -1) > self._last]
        if not new:
            return None
        self._last = int(new[-1].get("step", ctx.step))
        values = [v for v in (number(r.get(self.metric)) for r in new) if v is not None]
        return self._check(ctx, sum(values) / len(values)) if values else None

    def state_dict(self) -> dict[str, Any]:
        return {"best": self._best, "bad": self._bad, "last": self._last,
                "from_evals": self._from_evals}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._best, self._bad = state.get("best"), int(state.get("bad", 0))
        self._last, self._from_evals = state.get("last"), bool(state.get("from_evals", False))


class ReduceOnPlateau(_MetricWatch):
    """lr * ``factor`` after ``patience`` checks without a relative improvement of
    ``threshold``; then ``cooldown`` checks that do not count; never below ``min_lr``."""

    name = "reduce_on_plateau"
    drives = ("lr",)

    def __init__(self, metric: Any = "loss", mode: Any = "min", factor: Any = 0.1,
                 patience: Any = 5, threshold: Any = 1e-4, cooldown: Any = 0,
                 min_lr: Any = 0.0) -> None:
        super().__init__(metric, mode, patience)
        self.factor = check_float("factor", factor, 0.0, 1.0, low_open=True, high_open=True)
        self.threshold = check_float("threshold", threshold, low=0.0)
        self.cooldown = check_int("cooldown", cooldown, low=0)
        self.min_lr = check_float("min_lr", min_lr, low=0.0)
        self._cooling = 0

    def _improved(self, value: float, best: float) -> bool:
        margin = self.threshold * abs(best)
        return value < best - margin if self.mode == "min" else value > best + margin

    def _check(self, ctx: Context, value: float) -> Change | None:
        self._observe(value)
        if self._cooling > 0:
            self._cooling -= 1
            self._bad = 0
        cur = number(ctx.hparams.get("lr"))
        if self._bad < self.patience or cur is None:
            return None
        bad, self._bad = self._bad, 0
        new = max(cur * self.factor, self.min_lr)
        if new >= cur:
            return None  # already at min_lr
        self._cooling = self.cooldown
        return Change({"lr": new}, reason=(
            f"{self.metric} did not improve on {self._best:.4g} for {bad} checks: "
            f"lr {cur:.4g} -> {new:.4g}"))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "cooling": self._cooling}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self._cooling = int(state.get("cooling", 0))


class EarlyStopping(_MetricWatch):
    """Stop the job after ``patience`` checks without an improvement of ``min_delta``."""

    name = "early_stopping"
    drives = ()

    def __init__(self, metric: Any = "val_loss", mode: Any = "min", patience: Any = 5,
                 min_delta: Any = 0.0) -> None:
        super().__init__(metric, mode, patience)
        self.min_delta = check_float("min_delta", min_delta, low=0.0)
        self._stopped = False

    def _improved(self, value: float, best: float) -> bool:
        d = self.min_delta
        return value < best - d if self.mode == "min" else value > best + d

    def _check(self, ctx: Context, value: float) -> Change | None:
        if self._stopped:
            return None
        self._observe(value)
        if self._bad < self.patience:
            return None
        self._stopped = True
        return Change(action="stop", reason=(
            f"{self.metric} did not improve on {self._best:.4g} for {self._bad} checks"))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "stopped": self._stopped}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self._stopped = bool(state.get("stopped", False))
