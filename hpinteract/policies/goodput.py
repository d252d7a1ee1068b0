"""The ``goodput`` policy: the global batch and its split into micro-batches that make the
fastest progress, after Pollux/AdaptDL (OSDI'21; docs ALGORITHMS.md "Goodput").

Runs in: whichever process hosts it (rank 0's coordinator when added by name, or a
client). Torch-free: it reads ``step_time`` and the noise scale ``gns`` from the metric
records and returns ``batch_size`` (and, where the job has one, ``micro_batch``) changes;
the job's ``lr_scaling`` (AdaScale by default, as AdaptDL) moves the lr with the batch.

Goodput = throughput x statistical efficiency. The efficiency of a global batch M against
the batch the policy started at, M0, is (phi + M0) / (phi + M), phi the noise scale. The
throughput comes from a model of a step's time with ``s`` micro-batches of ``m`` samples a
rank, ``T = s * (alpha + beta * m) + delta`` (a micro-batch's fixed cost, its cost a
sample, and the once-a-step cost of the all-reduce and the optimizer), fitted to the step
times measured at each configuration the job has run. Pollux fits the same terms (and an
overlap exponent, which this model folds into the constants). With one configuration
measured the model cannot tell the fixed costs from the cost a sample: it takes half of
each, so that a larger batch looks at most twice as fast a sample until it is measured.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..protocol.errors import InvalidCommand
from ..protocol.hparams import BUILTINS
from .base import Change, Context, Policy
from .schedules import check_choice, check_float, check_int, number

LR_SCALINGS = BUILTINS["lr_scaling"].choices or ()
WINDOW = 64  # step times kept a configuration (their median is its time)
GRID = 48  # global batches tried, geometrically spaced
NICE = 8
# Step times before a configuration counts as measured: on a shared 2-core machine single
# step times of one configuration ranged over 5-50 ms, and a median of 5 once fitted a cost
# a sample of 0 (the larger batch measured faster), which sent the batch 35x up.
MEASURED = 10
# How far past the largest micro-batch measured a candidate may go: the fitted line is a
# guess beyond it (a cache, a kernel switch, memory), so the batch climbs in steps of at
# most 4x, each measured before the next.
TRUST = 4
REFRESH = 10  # steps between fits (and reported figures) outside the looks


class StepTimeModel:
    """``T(m, s) = s * (alpha + beta * m) + delta``, fitted to the median measured time of
    each configuration (m samples a rank in each of s micro-batches)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], deque[float]] = {}

    def observe(self, micro: int, accum: int, seconds: float) -> None:
        self.seen.setdefault((micro, accum), deque(maxlen=WINDOW)).append(seconds)

    def measured(self) -> dict[tuple[int, int], float]:
        return {k: statistics.median(v) for k, v in self.seen.items() if len(v) >= MEASURED}

    def fit(self) -> tuple[float, float, float] | None:
        """(alpha, beta, delta), each >= 0, or None before any configuration is measured.
        A term the configurations measured cannot tell apart gets a prior: without two
        micro-batch sizes a micro-batch's time is half fixed, half by sample; without two
        accumulation counts the fixed half is split between the micro-batch and the step."""
        points = self.measured()
        if not points:
            return None
        micros = {m for m, _ in points}
        cols = [0] + ([1] if len(micros) > 1 else []) + \
            ([2] if len({s for _, s in points}) > 1 else [])
        cols = cols[: len(points)]  # no more unknowns than configurations
        rows = np.array([[s, s * m, 1.0] for (m, s) in points], dtype=np.float64)
        times = np.array(list(points.values()), dtype=np.float64)
        params = np.zeros(3)
        keep = cols
        while keep:  # least squares; a term that comes out negative is dropped, then again
            sol = np.linalg.lstsq(rows[:, keep], times, rcond=None)[0]
            if (sol >= 0).all():
                params[keep] = sol
                break
            keep = [c for c, v in zip(keep, sol, strict=True) if v > 0]
        if 1 not in cols:
            (m,) = micros
            params[0], params[1] = params[0] / 2, params[0] / (2 * m)
        if 2 not in cols:
            # One accumulation count s: alpha stands for alpha + delta / s. Half of it is
            # taken for the step's own cost, so that accumulating looks worth measuring
            # where a rank's micro-batch is capped (then the fit is whole).
            (s,) = {s for _, s in points}
            params[2], params[0] = params[0] * s / 2, params[0] / 2
        return float(params[0]), float(params[1]), float(params[2])


def efficiency(batch: float, start: float, noise: float) -> float:
    """Pollux's statistical efficiency of ``batch`` against ``start``: (phi+M0)/(phi+M)."""
    return (noise + start) / (noise + batch)


class Goodput(Policy):
    """Every ``interval`` steps, the global batch (between the batch it started at and
    ``max_batch``) and micro-batch (up to ``max_micro_batch`` samples a rank) with the
    highest predicted goodput; a switch only for a gain above ``min_gain`` (AdaptDL: 5 %).
    Measurements of a configuration start ``settle`` steps after it took effect."""

    name = "goodput"
    drives = ("batch_size", "micro_batch")

    def __init__(self, max_batch: Any, max_micro_batch: Any = None, min_batch: Any = None,
                 interval: Any = 100, min_gain: Any = 0.05, settle: Any = 5,
                 lr_scaling: Any = "adascale", monitor_every: Any = 1) -> None:
        self.max_batch = check_int("max_batch", max_batch, low=1)
        self.max_micro = (None if max_micro_batch is None
                          else check_int("max_micro_batch", max_micro_batch, low=1))
        self.min_batch = None if min_batch is None else check_int("min_batch", min_batch, low=1)
        if self.min_batch is not None and self.min_batch > self.max_batch:
            raise InvalidCommand(f"min_batch ({self.min_batch}) must not exceed max_batch "
                                 f"({self.max_batch})", field="min_batch")
        self.interval = check_int("interval", interval, low=1)
        self.min_gain = check_float("min_gain", min_gain, low=0.0)
        self.settle = check_int("settle", settle, low=0)
        self.lr_scaling = check_choice("lr_scaling", lr_scaling, LR_SCALINGS)
        self.monitor_every = check_int("monitor_every", monitor_every, low=1)
        self.model = StepTimeModel()
        self.start: int | None = None  # M0: the batch the efficiency is measured against
        self._seen = -1  # the newest step whose time was taken
        self._refreshed = -REFRESH  # the step of the last fit and report
        self._decided: int | None = None  # the step of the last look (None: none yet)
        self._report: dict[str, float] = {}
        self._world: int | None = None  # the ranks the model's measurements were made on

    # ---- the hooks ----------------------------------------------------------------------
    def on_start(self, ctx: Context) -> Change | None:
        values: dict[str, Any] = {}
        if not ctx.hparams.get("monitor_gns"):
            values["monitor_gns"] = self.monitor_every
        if ctx.hparams.get("lr_scaling") != self.lr_scaling:
            values["lr_scaling"] = self.lr_scaling
        if not values:
            return None
        return Change(values, reason="goodput needs the gradient noise scale (monitor_gns) "
                      f"and lr_scaling={self.lr_scaling} to move the lr with the batch")

    def on_step(self, ctx: Context) -> Change | None:
        plan = self._plan(ctx)
        if plan is None:
            return None
        batch, micro, accum, world = plan
        if self.start is None:
            self.start = batch
        if world != self._world:  # resized: step times of another size are not this one's
            self.model, self._world = StepTimeModel(), world
        self._measure(ctx, micro, accum)
        # The fit and the figures every REFRESH steps, and at each look: this runs in the
        # coordinator, which shares rank 0's interpreter with its training thread.
        look = self._decided is None or ctx.step - self._decided >= self.interval
        if not look and ctx.step - self._refreshed < REFRESH:
            return None
        self._refreshed = ctx.step
        noise = number(ctx.metrics.get("gns"))
        fit = self.model.fit()
        if fit is None or noise is None or noise <= 0:
            self._report = {}  # nothing it could say now: no stale figure in the records
            return None
        now = self._goodput(fit, noise, world, micro, accum)
        self._report = {"goodput": now, "goodput_efficiency": efficiency(
            batch, self.start, noise), "goodput_step_fixed_s": fit[0] + fit[2],
            "goodput_sample_s": fit[1]}
        if "workers" in ctx.hparams:
            # What another size would give, with the same costs a rank (the once-a-step
            # cost of more ranks is not measured until it runs): for scale_workers and a
            # person deciding.
            for n in sorted({max(1, world // 2), world * 2} - {world}):
                self._report[f"goodput_workers_{n}"] = max(
                    self._goodput(fit, noise, *c)
                    for c in self._candidates(ctx, n, (micro, accum)))
        if not look:
            return None  # the first look comes as soon as the model has a measurement
        self._decided = ctx.step
        # The smallest batch among equals (max keeps the first): no switch for a tie.
        best = max(self._candidates(ctx, world, (micro, accum)),
                   key=lambda c: self._goodput(fit, noise, *c))
        then = self._goodput(fit, noise, *best)
        self._report["goodput_best"] = then
        _, b_micro, b_accum = best
        new = world * b_micro * b_accum
        if new == batch or then <= now * (1 + self.min_gain):
            return None
        values: dict[str, Any] = {"batch_size": new}
        if "micro_batch" in ctx.hparams and b_micro != ctx.hparams.get("micro_batch"):
            values["micro_batch"] = b_micro
        return Change(values, reason=(
            f"goodput {now:.4g} -> {then:.4g} predicted (x{then / now:.3g}): batch {batch} -> "
            f"{new} ({b_micro} x {b_accum} a rank); noise scale {noise:.4g}, efficiency "
            f"{efficiency(batch, self.start, noise):.3g} -> "
            f"{efficiency(new, self.start, noise):.3g}; step model {fit[0] * 1e3:.3g} ms a "
            f"micro-batch + {fit[1] * 1e6:.3g} us a sample + {fit[2] * 1e3:.3g} ms a step"))

    def report(self) -> Mapping[str, float]:
        return dict(self._report)

    # ---- the parts ----------------------------------------------------------------------
    def _plan(self, ctx: Context) -> tuple[int, int, int, int] | None:
        """(global batch, micro-batch, accumulation, ranks) in force, or None if unknown."""
        batch = number(ctx.hparams.get("batch_size"))
        world = max(1, int(ctx.world_size))
        if batch is None or batch < world or int(batch) % world:
            return None
        local = int(batch) // world
        micro = number(ctx.hparams.get("micro_batch")) if "micro_batch" in ctx.hparams else None
        m = int(micro) if micro and local % int(micro) == 0 else local
        return int(batch), m, local // m, world

    def _measure(self, ctx: Context, micro: int, accum: int) -> None:
        """Take the step times of the records not seen yet."""
        since = (ctx.applied_at if ctx.applied_at is not None else -1) + self.settle
        new = []
        for rec in reversed(ctx.history):  # newest first: only the few since the last call
            step = rec.get("step")
            if isinstance(step, int) and step <= self._seen:
                break
            if isinstance(step, int):
                new.append(rec)
        for rec in reversed(new):
            step, t = rec["step"], number(rec.get("step_time"))
            self._seen = step
            if step > since and t is not None and t > 0:
                self.model.observe(micro, accum, t)

    def _goodput(self, fit: tuple[float, float, float], noise: float, world: int,
                 micro: int, accum: int) -> float:
        alpha, beta, delta = fit
        batch = world * micro * accum
        seconds = accum * (alpha + beta * micro) + delta
        assert self.start is not None
        return batch / seconds * efficiency(batch, self.start, noise) if seconds > 0 else 0.0

    def _candidates(self, ctx: Context, world: int,
                    now: tuple[int, int]) -> list[tuple[int, int, int]]:
        """(ranks, micro, accumulation) for global batches spaced geometrically from the
        lower bound to ``max_batch``: the fewest micro-batches that fit ``max_micro_batch``
        (each adds a micro-batch's fixed cost), accumulation only where the job has a
        ``micro_batch`` to set, micro-batches at most ``TRUST`` times the largest measured.
        ``now`` (micro, accumulation) stands in where nothing else qualifies."""
        assert self.start is not None
        low = max(self.min_batch or self.start, world)
        high = self.max_batch
        spec_high = number(ctx.specs.get("batch_size", {}).get("high"))
        if spec_high is not None:
            high = min(high, int(spec_high))
        can_split = "micro_batch" in ctx.hparams
        trusted = TRUST * max((m for m, _ in self.model.measured()), default=now[0])
        out = set()
        for i in range(GRID):
            want = low * (high / low) ** (i / (GRID - 1)) if high > low else low
            local = max(1, round(want / world))
            if local >= 2 * NICE:  # a multiple of 8 a rank, as people and kernels like
                local = NICE * round(local / NICE)
            cap = self.max_micro or local
            accum = -(-local // cap) if can_split else 1
            if not can_split and local > cap:
                local = cap
            micro = max(1, local // accum)
            if low <= world * micro * accum <= high and micro <= trusted:
                out.add((world, micro, accum))
        return sorted(out) or [(world, *now)]

    # ---- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"start": self.start, "decided": self._decided,
                "seen": {f"{m}x{s}": list(v) for (m, s), v in self.model.seen.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        start = state.get("start")
        self.start = int(start) if isinstance(start, int | float) else None
        decided = state.get("decided")
        self._decided = int(decided) if isinstance(decided, int | float) else None
        seen = state.get("seen") or {}
        if not isinstance(seen, Mapping):
            raise InvalidCommand(f"goodput: bad saved state {seen!r}")
        for key, times in seen.items():
            m, _, s = str(key).partition("x")
            if not (m.isdigit() and s.isdigit() and isinstance(times, list)):
                raise InvalidCommand(f"goodput: bad saved configuration {key!r}: {times!r}")
            for t in times:
                self.model.observe(int(m), int(s), float(t))
