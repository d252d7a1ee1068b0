"""The gradient noise scale monitor (per-rank step and data-wait times are rank_times.py's).

Runs in: every rank's training thread (partly inside autograd's backward, on the thread
that runs it; rank 0 publishes). It is a hyper-parameter (``monitor_gns``: every N steps,
0 for off), so every rank switches it at the same step, and whether a step is measured
depends only on the step index: ranks never disagree on the size of a collective.

Noise scale (McCandlish et al. 2018; ALGORITHMS.md). The small batch is a micro-batch of
one rank: a gradient hook on each parameter sees the rank's gradient before it is
accumulated and all-reduced (AdaptDL collects it the same way), and the ranks' small norms
are averaged. The big batch is the global one, the all-reduced mean in .grad, the same on
every rank: so each rank sums the squares of its own 1/world slice of it, and the ranks'
sums are added up. Every rank then reads its own gradient once and 1/world of the reduced
one, where rank 0, which every rank waits for, read both whole. (Sharing out the small
norm the same way was tried and dropped: with each coordinate from one rank's gradient the
|G| cross terms no longer cancel between the small and the big norm, and the estimate of
benchmarks/gns_accuracy.py was 42 % off instead of 2 %.)
With one rank and no accumulation, two consecutive steps' gradients stand in for two ranks
(AdaptDL's fallback). The two estimates are smoothed separately (bias-corrected EMA)
before dividing. Only on measured steps are the hooks in place; on a GPU the sums stay
tensors, so nothing waits for the device. (A Python DDP communication hook, the other way
to see local gradients, cost about 1 ms a step on the benchmark's 6 ms steps; these hooks
cost about 0.1 ms.)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

Number = Any  # a float on CPU, a 0-d tensor on a device


class NoiseScale:
    """The estimator: feed (|g_small|^2, B_small, |g_big|^2, B_big) per measured step, read
    the smoothed |G|^2, tr(Sigma) and their ratio.

    Each step's |G|^2 and tr(Sigma) are linear in the two norms, so their EMAs are kept as
    EMAs of the norms' terms, c*small, d*small, a*big and d*big (a, c, d from the batch
    sizes). Being linear, a rank can smooth the terms of its own small norm and of its share
    of the big one alone: the ranks' mean of the first two and sum of the last two are the
    EMAs of the mean small and whole big norm, so the ranks combine theirs only when an
    estimate is published, not at every step.
    """

    def __init__(self) -> None:
        self.n = 0
        self._keep = 1.0  # the product of the smoothing factors so far (for the debias)
        self._terms: list[Number] = [0.0, 0.0, 0.0, 0.0]  # EMAs of c*small, d*small, a*big, d*big
        self._ratio: Number | None = None  # the last published B_simple

    def add(self, small: Number, b_small: float, big: Number, b_big: float,
            alpha: float) -> None:
        a, c = b_big / (b_big - b_small), b_small / (b_big - b_small)
        d = 1.0 / (1.0 / b_small - 1.0 / b_big)
        self.n += 1
        self._keep *= alpha
        new = (c * small, d * small, a * big, d * big)
        self._terms = [alpha * t + (1 - alpha) * x for t, x in zip(self._terms, new, strict=True)]

    def terms(self) -> tuple[list[Number], float]:
        """This rank's smoothed terms, to be combined over the ranks, and the debias divisor
        (the same on every rank: they measure the same steps)."""
        return list(self._terms), 1.0 - self._keep

    def estimate(self, terms: list[Number] | None = None,
                 debias: float | None = None) -> dict[str, Number]:
        """|G|^2, tr(Sigma) and B_simple from the ranks' combined ``terms`` (default: this
        rank's, all of them with one rank) and their ``debias`` (default: now)."""
        cs, ds, ab, db = terms if terms is not None else self._terms
        debias = debias if debias is not None else 1.0 - self._keep
        g2, s = (ab - cs) / debias, (ds - db) / debias
        gns = (s / g2 if g2 else math.nan) if isinstance(g2, float) else s / g2
        self._ratio = gns
        return {"gns_grad_sq": g2, "gns_var": s, "gns": gns}

    def simple(self) -> float | None:
        """The last published B_simple as a number (None before any). On a device this waits
        for it: only lr scaling asks, when the batch size changes."""
        return None if self._ratio is None else float(self._ratio)


def share(numel: int, rank: int, world: int) -> slice:
    """The part of a parameter's flattened all-reduced gradient whose squares ``rank`` sums:
    the ranks' parts cover it once, in nearly equal lengths (a one-element bias falls to one
    rank)."""
    return slice(numel * rank // world, numel * (rank + 1) // world)


class GNSMonitor:
    """Measures the noise scale of the steps ``monitor_gns`` selects, on every rank (each
    contributes its own small norm and its share of the big one); rank 0 publishes."""

    REDUCE_EVERY = 16  # steps between combinations of the ranks' terms (at most: measured)

    def __init__(self, model: Any, params: list[Any], world: int, rank: int) -> None:
        self.model, self.params, self.world, self.rank = model, params, world, rank
        # This rank's part of each parameter's reduced gradient; None: all (one rank).
        self.shares: list[slice | None] = [share(p.numel(), rank, world) if world > 1 else None
                                           for p in params]
        self.estimator = NoiseScale()
        self.measuring = False
        self._pairs = False
        self._handles: list[Any] = []
        self._parts: list[Any] = []  # |g|^2 per parameter of the current micro-batch
        self._small: Number = 0.0  # sum over this step's micro-batches of their |g_i|^2
        self._count = 0
        self._big: Number | None = None
        self._prev: list[Any] | None = None  # one rank, no accumulation: last step's grads
        self._now: list[Any] | None = None  # ... and this step's, if run.backward saw them
        # The ranks' sum of their smoothed terms and of the issuing step's big-norm share,
        # in flight: (its work, its tensor, the debias when it was issued).
        self._inflight: tuple[Any, Any, float] | None = None
        self._issued: int | None = None
        self._skip = False

    def arm(self, step: int, every: int, accumulation: int) -> None:
        """Decide whether step ``step`` is measured, and hook the parameters only then:
        a step that is not measured pays nothing, not even an idle hook."""
        self._pairs = self.world == 1 and accumulation == 1
        if every <= 0 and self._inflight is not None:  # switched off: nothing to publish
            self._inflight[0].wait()
            self._inflight = self._issued = None
        self.measuring = every > 0 and (
            step % every == 0 or (self._pairs and every > 1 and step % every == 1))
        want = self.measuring and not self._pairs
        if want and not self._handles:
            self._handles = [p.register_hook(self._grad_hook) for p in self.params]
        elif not want and self._handles:
            for h in self._handles:
                h.remove()
            self._handles = []

    def _grad_hook(self, grad: Any) -> None:
        # Autograd calls this with the rank's own gradient, before it is accumulated into
        # .grad and so before DDP all-reduces it; the norm is taken now, as the tensor may
        # be reduced in place afterwards.
        self._parts.append(_sq(grad.detach()))

    def after_backward(self, micro_index: int, micro_count: int, weight: float) -> None:
        """After a micro-batch's backward (run.backward): close its small-batch term."""
        if not self.measuring:
            return
        if self._pairs:  # copied: zero_grad(set_to_none=False) would zero them in place
            self._now = [g.clone() for g in self._grads()]
            return
        self._close_micro(weight)
        if micro_index == micro_count - 1:  # .grad: the all-reduced mean
            self._big = self._own_big()

    def _close_micro(self, weight: float) -> None:
        if self._parts:
            self._small = self._small + _total(self._parts) / (weight * weight)
            self._count += 1
            self._parts = []

    def _own_big(self) -> Number:
        """|.grad|^2 over this rank's share: all of it with one rank."""
        parts = [_sq(p.grad.detach(), part) for p, part in zip(self.params, self.shares,
                                                                strict=True)
                 if p.grad is not None]
        return _total(parts)

    def skip_step(self) -> None:
        """Drop this step's measurement: its gradients were changed (clipped) before they
        could be read. Every rank skips the same steps (the clip is decided on the
        all-reduced gradient), so their collectives still match."""
        self._skip = True

    def step_done(self, step: int, batch: int, micro: int, accumulation: int,
                  alpha: float) -> dict[str, Number] | None:
        """At run.step: combine what the step measured; metrics for rank 0's record.

        The small batch is a micro-batch (the rank's share of the step without
        accumulation); the big one is the global batch, read from .grad after the
        all-reduce (zero gradients before the backward, not before run.step)."""
        if not self.measuring:
            return None
        if self._skip:
            self._skip = False
            self._parts, self._small, self._count, self._big = [], 0.0, 0, None
            self._now = self._prev = None
            return None
        if self._pairs:
            return self._pair_step(batch, alpha)
        self._close_micro(1.0)  # the script called loss.backward() itself
        small, count, big = self._small, self._count, self._big
        self._small, self._count, self._big = 0.0, 0, None
        if big is None:
            big = self._own_big()
        if not count or micro <= 0 or batch <= micro:
            return None
        est = self.estimator
        big = _num(big)
        est.add(_num(small / count), micro, big, batch, alpha)
        if self.world == 1:
            return {"grad_norm": big ** 0.5, **est.estimate()}
        # Each rank holds the smoothed terms of its small norm and of its share of the big
        # one: the estimate takes the ranks' mean of the first and sum of the second. It is
        # taken by an asynchronous all-reduce on the model's own group (NCCL on GPUs:
        # no host sync), issued at the same steps on every rank every REDUCE_EVERY steps and
        # read at the next measured step, long since done: the extra collective (and gloo's
        # per-call thread hand-off) stays off most steps. The issuing step's big-norm shares
        # travel with it: grad_norm is published with the estimate.
        out: dict[str, Number] = {}
        if self._inflight is not None:
            work, t, debias = self._inflight
            self._inflight = None
            work.wait()
            if self.rank == 0:
                total = [_num(x) for x in t]
                out = {"grad_norm": total[4] ** 0.5,  # a sum of squares: no max (a sync)
                       **est.estimate(total[:4], debias)}
        if self._issued is None or step - self._issued >= self.REDUCE_EVERY:
            (cs, ds, ab, db), debias = est.terms()
            t = _pack([cs / self.world, ds / self.world, ab, db, big])
            self._inflight = (dist.all_reduce(t, async_op=True), t, debias)
            self._issued = step
        return out or None

    def _pair_step(self, batch: int, alpha: float) -> dict[str, Number] | None:
        copied = self._now is not None
        grads, self._now = self._now or self._grads(), None
        if not grads:
            return None
        if self._prev is None:
            self._prev = grads if copied else [g.clone() for g in grads]
            return None
        prev, self._prev = self._prev, None
        small = (_sumsq(prev) + _sumsq(grads)) / 2
        mean = [(a + b) / 2 for a, b in zip(prev, grads, strict=True)]
        big = _num(_sumsq(mean))
        self.estimator.add(_num(small), batch, big, 2 * batch, alpha)
        return {"grad_norm": big ** 0.5, **self.estimator.estimate()}

    def _grads(self) -> list[Any]:
        return [p.grad.detach() for p in self.params if p.grad is not None]


def _plain_cpu(t: Any) -> bool:
    """A contiguous float32 CPU tensor outside autograd: numpy can view it as it is."""
    return bool(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
                and not t.requires_grad)


def _cpu_sq(t: Any, part: slice | None) -> float:
    """|t|^2 of a ``_plain_cpu`` tensor: numpy's BLAS dot on a zero-copy view, the same
    sdot as torch.dot without the dispatcher (13 against 36 us for the six gradients of
    the benchmark's CNN)."""
    v = t.numpy().reshape(-1)
    v = v if part is None else v[part]
    return float(np.dot(v, v))


def _sq(t: Any, part: slice | None = None) -> Number:
    """|t|^2 (over ``part`` of its flattened elements), in one pass and no temporary of its
    size: a float on CPU, a 0-d float32 tensor on a device (no sync)."""
    if _plain_cpu(t):
        return _cpu_sq(t, part)
    if t.dtype == torch.float32 and t.is_contiguous():
        flat = t.view(-1) if part is None else t.view(-1)[part]
        # One op, where vector_norm(t) ** 2 costs two (on CPU the dot was also 30 %
        # cheaper): the passes over the gradients are most of the monitor.
        sq = torch.dot(flat, flat)
    else:
        flat = t.reshape(-1) if part is None else t.reshape(-1)[part]
        sq = torch.linalg.vector_norm(flat, dtype=torch.float32).square()
    # On CPU a float at once: adding them up in Python costs nothing, where stacking and
    # summing 0-d tensors costs two ops of ~50 us each on the step (measured).
    return float(sq) if sq.device.type == "cpu" else sq


def _total(parts: list[Number]) -> Number:
    """The sum of _sq's results: Python's on CPU, one stacked sum on a device."""
    if not parts:
        return 0.0
    if isinstance(parts[0], torch.Tensor):
        return torch.stack(parts).sum()
    return sum(parts)


def _sumsq(tensors: list[Any]) -> Number:
    if not tensors:
        return 0.0
    if tensors[0].device.type != "cpu":
        # On a device, torch's fused per-tensor norms (what clip_grad_norm_ uses): one
        # launch for all, however many parameters.
        norms = torch._foreach_norm([t.float() if t.dtype != torch.float32 else t
                                     for t in tensors])
        return torch.stack(norms).square().sum()
    return _total([_sq(t) for t in tensors])


def _pack(values: list[Number]) -> Any:
    """This rank's shares, as one tensor for a sum over ranks (on the device of any that are
    device tensors: nothing waits for it)."""
    dev = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
    if dev is None or dev.type == "cpu":
        return torch.tensor([float(v) for v in values], dtype=torch.float64)
    return torch.stack([torch.as_tensor(v, dtype=torch.float32, device=dev).reshape(())
                        for v in values])


def _num(v: Any) -> Number:
    """A CPU scalar as a float (free); a device scalar stays a tensor (no sync)."""
    if isinstance(v, torch.Tensor) and v.device.type == "cpu":
        return float(v)
    return v
