"""Learning-rate schedules as policies (``Warmup``, ``Schedule``) and the argument checks of
every built-in policy.

Runs in: whichever process hosts it: rank 0's coordinator for built-ins, or a client.
Torch-free. The schedules are multiplicative: they scale whatever lr the job has now by the
ratio of their new factor to the one they applied last, so a live edit (after ``enable``),
``lr_scaling`` and another schedule compose with them instead of being overwritten.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..protocol.errors import InvalidCommand
from .base import Change, Context, Policy

# ---- argument checks: a policy's parameters arrive as JSON from a client ----------------------


def _bad(name: str, what: str, value: Any) -> InvalidCommand:
    return InvalidCommand(f"{name} must be {what}, got {repr(value)[:40]}", field=name)


def check_int(name: str, value: Any, low: int | None = None) -> int:
    # JSON gives 2.0 for 2 from some clients; anything else fractional is an error.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or (low is not None and value < low):
        raise _bad(name, "an integer" + (f" >= {low}" if low is not None else ""), value)
    return value


def check_float(name: str, value: Any, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False) -> float:
    ok = _finite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        bounds = ([f"{'>' if low_open else '>='} {low:g}"] if low is not None else []) + \
                 ([f"{'<' if high_open else '<='} {high:g}"] if high is not None else [])
        raise _bad(name, " ".join(["a finite number", " and ".join(bounds)]).strip(), value)
    return float(value)


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise _bad(name, "one of " + ", ".join(choices), value)
    return str(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, "true or false", value)
    return value


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, not a number, NaN, inf)."""
    return float(value) if _finite(value) else None


def _finite(value: Any) -> bool:
    """A real number a float can hold (an int such as 10**400 overflows: it cannot)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


# ---- multiplicative lr policies ---------------------------------------------------------------


class _ScaledLR(Policy):
    """Keeps lr = base * factor, where base is re-derived whenever someone else moved lr."""

    drives = ("lr",)

    def __init__(self, min_rel_change: Any) -> None:
        self.min_rel_change = check_float("min_rel_change", min_rel_change, low=0.0)
        self._applied = 1.0  # the factor in the job's lr now
        self._base: float | None = None  # the job's lr at factor 1
        self._set: float | None = None  # the lr this policy set last
        self._t0: int | None = None
        self._done = False

    def _propose(self, ctx: Context, f: float, force: bool, why: str) -> Change | None:
        cur = number(ctx.hparams.get("lr"))
        if cur is None:
            return None
        # Unchanged since our last change: keep the exact base (the last step lands exactly
        # on it); moved by a person, lr_scaling or another schedule: compose with that.
        if self._base is None or self._set is None or not math.isclose(cur, self._set,
                                                                       rel_tol=1e-9):
            self._base = cur / self._applied
        if f == self._applied or (not force and abs(f / self._applied - 1.0)
                                  < self.min_rel_change):
            return None
        new = self._base * f
        self._applied, self._set = f, new
        return Change({"lr": new}, reason=f"{why}: lr {cur:.4g} -> {new:.4g} (x{f:.4g})")

    def state_dict(self) -> dict[str, Any]:
        return {"applied": self._applied, "base": self._base, "set": self._set,
                "t0": self._t0, "done": self._done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._applied = float(state.get("applied", 1.0))
        self._base, self._set = state.get("base"), state.get("set")
        self._t0, self._done = state.get("t0"), bool(state.get("done", False))


class Warmup(_ScaledLR):
    """Linear warmup from ``start_factor`` * lr to lr over ``steps`` steps from its start."""

    name = "warmup"

    def __init__(self, steps: Any, start_factor: Any = 0.1, min_rel_change: Any = 0.01) -> None:
        super().__init__(min_rel_change)
        self.steps = check_int("steps", steps, low=1)
        self.start_factor = check_float("start_factor", start_factor, 0.0, 1.0, low_open=True)

    def on_start(self, ctx: Context) -> Change | None:
        self._t0 = ctx.step
        if self.start_factor == 1.0:
            self._done = True
            return None
        return self._propose(ctx, self.start_factor, True, f"warmup over {self.steps} steps")

    def on_step(self, ctx: Context) -> Change | None:
        if self._done:
            return None
        if self._t0 is None:
            self._t0 = ctx.step
        t0 = self._t0
        frac = min(1.0, (ctx.step - t0) / self.steps)
        f = 1.0 if frac >= 1.0 else self.start_factor + (1.0 - self.start_factor) * frac
        change = self._propose(ctx, f, f == 1.0, f"warmup {ctx.step - t0}/{self.steps}")
        self._done = f == 1.0 and self._applied == 1.0
        return change


class Schedule(_ScaledLR):
    """``kind="step"``: lr * ``gamma`` at each of ``milestones`` (absolute steps, those after
    its start); ``kind="cosine"``: cosine from lr at its start to ``min_factor`` * lr at the
    absolute step ``total_steps``."""

    name = "schedule"

    def __init__(self, kind: Any, milestones: Any = None, gamma: Any = 0.1,
                 total_steps: Any = None, min_factor: Any = 0.0,
                 min_rel_change: Any = 0.01) -> None:
        super().__init__(min_rel_change)
        self.kind = check_choice("kind", kind, ("step", "cosine"))
        self.gamma = check_float("gamma", gamma, low=0.0, low_open=True)
        self.min_factor = check_float("min_factor", min_factor, 0.0, 1.0)
        self.milestones: list[int] = []
        self.total_steps = 0
        if self.kind == "step":
            if total_steps is not None:
                raise _bad("total_steps", "left out with kind='step' (it uses milestones)",
                           total_steps)
            if not isinstance(milestones, list | tuple) or not milestones:
                raise _bad("milestones", "a non-empty list of steps (kind='step')", milestones)
            self.milestones = sorted(check_int("milestones", m, low=0) for m in milestones)
        else:
            if milestones is not None:
                raise _bad("milestones", "left out with kind='cosine' (it uses total_steps)",
                           milestones)
            if total_steps is None:
                raise _bad("total_steps", "the absolute step where the cosine ends "
                           "(kind='cosine')", total_steps)
            self.total_steps = check_int("total_steps", total_steps, low=1)

    def factor(self, step: int) -> tuple[float, bool]:
        """The schedule's factor at ``step``, and whether it is final."""
        t0 = self._t0 or 0
        if self.kind == "step":
            passed = [m for m in self.milestones if t0 < m <= step]
            return self.gamma ** len(passed), step >= self.milestones[-1]
        span = self.total_steps - t0
        frac = 1.0 if span <= 0 else min(1.0, max(0.0, (step - t0) / span))
        f = self.min_factor + (1.0 - self.min_factor) * 0.5 * (1.0 + math.cos(math.pi * frac))
        # A factor of 0 would make the next ratio infinite (and lr unrecoverable).
        return max(f, 1e-6), frac >= 1.0

    def on_start(self, ctx: Context) -> Change | None:
        self._t0 = ctx.step
        return self.on_step(ctx)

    def on_step(self, ctx: Context) -> Change | None:
        if self._done:
            return None
        if self._t0 is None:
            self._t0 = ctx.step
        f, final = self.factor(ctx.step)
        # Step decays are rare and deliberate: never hold one back for min_rel_change.
        change = self._propose(ctx, f, final or self.kind == "step",
                               f"{self.kind} schedule at step {ctx.step}")
        self._done = final and self._applied == f
        return change
