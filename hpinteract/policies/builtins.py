"""Built-in policies (adaptive batch size, divergence guard; the metric watchers are in
plateau.py, the schedules in schedules.py) and the registry that builds any built-in from a
name and JSON parameters.

Runs in: whichever process hosts it: rank 0's coordinator for built-ins, or a client.
Torch-free: it reads the plain numbers of metric records and returns changes.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

from ..protocol.errors import InvalidCommand
from .base import Change, Context, Policy
from .goodput import LR_SCALINGS, Goodput
from .plateau import EarlyStopping, ReduceOnPlateau
from .resources import ScaleWorkers
from .schedules import (
    Schedule,
    Warmup,
    check_bool,
    check_choice,
    check_float,
    check_int,
    number,
)


class AdaptiveBatchSize(Policy):
    """Grow the global batch towards ``target`` * the gradient noise scale (KungFu, AdaptDL).

    A change needs the condition on ``patience`` consecutive checks (a noisy estimate near the
    threshold must not make the batch flap) and ``cooldown`` steps since its last change took
    effect; checks inside the cooldown do not count, the estimate is still settling there.

    ``lr_scaling`` (AdaScale by default, as AdaptDL and ``goodput``) moves the lr with the
    batch; ``None`` leaves the job's own rule. With the lr held fixed a batch grown 32x made
    little progress a sample (3.7x slower than the best static batch on a held-out task);
    with AdaScale a grown batch keeps the starting batch's noise floor, so a target below
    that floor needs an lr schedule (docs/PERFORMANCE.md, the teacher task).
    """

    name = "adaptive_batch"
    drives = ("batch_size",)

    def __init__(self, max_batch: Any, min_batch: Any = None, factor: Any = 2,
                 target: Any = 1.0, patience: Any = 3, cooldown: Any = 100,
                 allow_decrease: Any = False, lr_scaling: Any = "adascale",
                 monitor_every: Any = 1) -> None:
        self.max_batch = check_int("max_batch", max_batch, low=1)
        self.min_batch = None if min_batch is None else check_int("min_batch", min_batch, low=1)
        if self.min_batch is not None and self.min_batch > self.max_batch:
            raise InvalidCommand(f"min_batch ({self.min_batch}) must not exceed max_batch "
                                 f"({self.max_batch})", field="min_batch")
        self.factor = check_int("factor", factor, low=2)
        self.target = check_float("target", target, low=0.0, low_open=True)
        self.patience = check_int("patience", patience, low=1)
        self.cooldown = check_int("cooldown", cooldown, low=0)
        self.allow_decrease = check_bool("allow_decrease", allow_decrease)
        self.lr_scaling = (None if lr_scaling is None
                           else check_choice("lr_scaling", lr_scaling, LR_SCALINGS))
        self.monitor_every = check_int("monitor_every", monitor_every, low=1)
        self._streak = 0  # > 0: checks in a row asking to grow; < 0: to shrink

    def on_start(self, ctx: Context) -> Change | None:
        values: dict[str, Any] = {}
        if not ctx.hparams.get("monitor_gns"):
            values["monitor_gns"] = self.monitor_every
        if self.lr_scaling is not None and ctx.hparams.get("lr_scaling") != self.lr_scaling:
            values["lr_scaling"] = self.lr_scaling
        if not values:
            return None
        return Change(values, reason="adaptive batch size needs the gradient noise scale"
                      + (f" and lr_scaling={self.lr_scaling}" if "lr_scaling" in values else ""))

    def on_step(self, ctx: Context) -> Change | None:
        gns = number(ctx.metrics.get("gns"))
        current = ctx.hparams.get("batch_size")
        if isinstance(current, float) and current.is_integer():
            current = int(current)  # a job may report it through JSON as 64.0
        if gns is None or gns <= 0 or not isinstance(current, int) or current < 1:
            return None  # early or broken estimates are no evidence either way
        if ctx.applied_at is not None and ctx.step - ctx.applied_at < self.cooldown:
            return None  # the streak restarted at the decision
        desired = self.target * gns
        micro = ctx.hparams.get("micro_batch")
        unit = max(1, ctx.world_size) * (micro if isinstance(micro, int) and micro > 0 else 1)
        high = ctx.specs.get("batch_size", {}).get("high")
        cap = min(self.max_batch, high) if isinstance(high, int | float) else self.max_batch
        floor = max(self.min_batch or unit, unit)
        if desired >= current * self.factor and current < cap:
            self._streak = max(self._streak, 0) + 1
            new = min(current * self.factor, int(cap)) // unit * unit  # down: stay <= cap
        elif self.allow_decrease and desired * self.factor <= current and current > floor:
            self._streak = min(self._streak, 0) - 1
            new = -(-max(current // self.factor, floor) // unit) * unit  # up: stay >= floor
        else:
            self._streak = 0
            return None
        if abs(self._streak) < self.patience:
            return None
        self._streak = 0
        if new == current or new < unit:
            return None
        return Change({"batch_size": new}, reason=(
            f"gradient noise scale {gns:.4g} samples (x{self.target:g} = {desired:.4g}) for "
            f"{self.patience} checks: batch_size {current} -> {new}"))

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self._streak}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._streak = int(state.get("streak", 0))


class DivergenceGuard(Policy):
    """On a NaN/inf loss, or one above ``explode`` * the best smoothed loss, roll the job back
    to its last good step with lr * ``lr_factor``; stop after ``max_rollbacks`` rollbacks.

    ``snapshot_every`` tells the host how often the job must keep an in-memory snapshot.
    """

    name = "divergence_guard"
    drives = ()
    ALPHA = 0.9
    MIN_LOSSES = 10  # a baseline from fewer losses is noise

    def __init__(self, lr_factor: Any = 0.5, explode: Any = 10.0, snapshot_every: Any = 100,
                 max_rollbacks: Any = 3) -> None:
        self.lr_factor = check_float("lr_factor", lr_factor, 0.0, 1.0, low_open=True)
        self.explode = check_float("explode", explode, low=1.0, low_open=True)
        self.snapshot_every = check_int("snapshot_every", snapshot_every, low=1)
        self.max_rollbacks = check_int("max_rollbacks", max_rollbacks, low=0)
        self._scanned: int | None = None  # the newest step scanned
        self._ema = 0.0  # of finite losses, not bias-corrected
        self._seen = 0  # finite losses in the EMA
        self._baseline: float | None = None
        self._good: int | None = None  # the newest step with a good loss
        self._rollbacks = 0
        self._stopped = False

    def on_step(self, ctx: Context) -> Change | None:
        if self._stopped:
            return None
        for rec in ctx.history:
            step = rec.get("step")
            if not isinstance(step, int) or (self._scanned is not None and step <= self._scanned):
                continue
            self._scanned = step
            # Made before our last rollback took effect: the diverged run's records.
            if ctx.applied_at is not None and step < ctx.applied_at:
                continue
            loss = rec.get("loss")
            if not isinstance(loss, int | float) or isinstance(loss, bool):
                continue
            why = self._diverged(float(loss))
            if why:
                return self._react(ctx, step, why)
            self._seen += 1
            self._ema = self.ALPHA * self._ema + (1 - self.ALPHA) * loss
            smoothed = self._ema / (1 - self.ALPHA ** self._seen)
            self._baseline = smoothed if self._baseline is None else min(self._baseline,
                                                                         smoothed)
            self._good = step
        return None

    def _diverged(self, loss: float) -> str:
        if not math.isfinite(loss):
            return f"loss is {loss}"
        base = self._baseline
        # A baseline <= 0 (a loss that can go negative) gives no scale to compare with.
        if self._seen >= self.MIN_LOSSES and base is not None and base > 0 \
                and loss > self.explode * base:
            return f"loss {loss:.4g} > {self.explode:g} x the smoothed best {base:.4g}"
        return ""

    def _react(self, ctx: Context, step: int, why: str) -> Change:
        if self._rollbacks >= self.max_rollbacks or self._good is None:
            self._stopped = True
            after = (f"after {self._rollbacks} rollbacks" if self._good is not None
                     else "and no earlier step had a good loss")
            return Change(action="stop", reason=f"diverged at step {step} ({why}) {after}")
        self._rollbacks += 1
        lr = number(ctx.hparams.get("lr"))
        values = {} if lr is None else {"lr": lr * self.lr_factor}
        return Change(values, action="rollback", to_step=self._good, reason=(
            f"diverged at step {step} ({why}): back to step {self._good} with lr "
            f"x{self.lr_factor:g} (rollback {self._rollbacks} of {self.max_rollbacks})"))

    def state_dict(self) -> dict[str, Any]:
        return {"scanned": self._scanned, "ema": self._ema, "seen": self._seen,
                "baseline": self._baseline, "good": self._good, "rollbacks": self._rollbacks,
                "stopped": self._stopped}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._scanned, self._good = state.get("scanned"), state.get("good")
        self._ema, self._seen = float(state.get("ema", 0.0)), int(state.get("seen", 0))
        self._baseline = state.get("baseline")
        self._rollbacks = int(state.get("rollbacks", 0))
        self._stopped = bool(state.get("stopped", False))


REGISTRY: dict[str, type[Policy]] = {cls.name: cls for cls in (
    AdaptiveBatchSize, Goodput, Warmup, Schedule, ReduceOnPlateau, EarlyStopping,
    DivergenceGuard, ScaleWorkers)}


def create(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """The built-in policy ``name`` made from JSON ``params``, or InvalidCommand saying why not."""
    cls = REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise InvalidCommand(f"unknown policy {name!r} (known: {', '.join(sorted(REGISTRY))})")
    params = {} if params is None else params
    if not isinstance(params, Mapping):
        raise InvalidCommand(f"{name}: parameters must be a mapping of names to values, not "
                             f"{type(params).__name__}")
    sig = {k: p for k, p in inspect.signature(cls.__init__).parameters.items() if k != "self"}
    accepted = ", ".join(sig)
    unknown = sorted(str(k) for k in params if k not in sig)
    if unknown:
        raise InvalidCommand(f"{name}: unknown parameter{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)} (accepted: {accepted})", field=unknown[0])
    missing = [k for k, p in sig.items() if p.default is inspect.Parameter.empty
               and k not in params]
    if missing:
        raise InvalidCommand(f"{name}: missing required parameter{'s' if len(missing) > 1 else ''}"
                             f" {', '.join(missing)} (accepted: {accepted})", field=missing[0])
    try:
        return cls(**params)
    except InvalidCommand as e:
        raise InvalidCommand(f"{name}: {e.message}", field=e.field) from None
