"""Training monitors: the gradient noise scale and per-rank step and data-wait times.

Runs in: every rank's training thread (and, for the noise scale across ranks, inside DDP's
communication hook, on whichever thread completes the all-reduce). Each monitor is a
hyper-parameter (``monitor_gns``, ``monitor_ranks``: every N steps, 0 for off), so every
rank switches it at the same step, and whether a step is measured depends only on the step
index: ranks never disagree on the size of a collective.

Noise scale (McCandlish et al. 2018; ALGORITHMS.md). With several ranks the small batch is
a rank's own gradient before DDP's all-reduce and the big one the all-reduced mean; the
hook appends each rank's local |g|^2 to the bucket it all-reduces anyway, so the mean of
the ranks' small norms costs one extra number in a collective that runs regardless. With one
rank and accumulation each micro-batch is a small batch; with one rank and no
accumulation two consecutive steps' gradients stand in for two ranks (AdaptDL's fallback).
The two estimates are smoothed separately (bias-corrected EMA) before dividing. On a GPU the
sums stay tensors: nothing here waits for the device.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

Number = Any  # a float on CPU, a 0-d tensor on a device


class NoiseScale:
    """The estimator: feed (|g_small|^2, B_small, |g_big|^2, B_big), read the smoothed values."""

    def __init__(self) -> None:
        self.n = 0
        self._g2: Number = 0.0
        self._s: Number = 0.0

    def update(self, small: Number, b_small: float, big: Number, b_big: float,
               alpha: float) -> dict[str, Number]:
        g2 = (b_big * big - b_small * small) / (b_big - b_small)  # |G|^2, unbiased
        s = (small - big) / (1.0 / b_small - 1.0 / b_big)  # tr(Sigma), per sample
        self.n += 1
        self._g2 = alpha * self._g2 + (1 - alpha) * g2
        self._s = alpha * self._s + (1 - alpha) * s
        debias = 1 - alpha ** self.n
        g2_hat, s_hat = self._g2 / debias, self._s / debias
        out = {"grad_norm": big ** 0.5, "gns_grad_sq": g2_hat, "gns_var": s_hat}
        if isinstance(g2_hat, float):
            out["gns"] = s_hat / g2_hat if g2_hat else math.nan
        else:
            out["gns"] = s_hat / g2_hat
        return out

    def simple(self) -> float | None:
        """The current smoothed B_simple as a number (None before any estimate)."""
        if not self.n:
            return None
        ratio = self._s / self._g2 if not isinstance(self._g2, float) or self._g2 else math.nan
        return float(ratio)


class GNSMonitor:
    """Measures the noise scale of the steps ``monitor_gns`` selects, for one rank."""

    def __init__(self, model: Any, params: list[Any], world: int, rank: int) -> None:
        self.model, self.params, self.world, self.rank = model, params, world, rank
        self.estimator = NoiseScale()
        self.measuring = False
        self.unsupported: str | None = None
        self._hooked = False
        self._small: list[Any] = []  # filled by hooks (maybe on a communication thread)
        self._big: list[Any] = []
        self._prev: list[Any] | None = None  # one rank, no accumulation: last step's grads
        self._now: list[Any] | None = None  # ... and this step's, if run.backward saw them
        self._acc: list[Any] | None = None  # accumulation: the gradient so far this step
        from torch.nn.parallel import DistributedDataParallel as DDP

        self._ddp = isinstance(model, DDP)
        if world > 1 and not self._ddp:
            self.unsupported = ("the noise-scale monitor needs the model wrapped in "
                                "DistributedDataParallel when there are several ranks")

    def arm(self, step: int, every: int, accumulation: int) -> None:
        """Decide (identically on every rank) whether step ``step`` is measured."""
        if self.unsupported or every <= 0:
            self.measuring = False
            return
        if self.world > 1 and not self._hooked:
            # Installed on first use, so a job that never monitors keeps DDP's C++ hook.
            self._install_hook()
        # With one rank and no accumulation a measurement needs two consecutive steps.
        pairs = self.world == 1 and accumulation == 1
        self.measuring = step % every == 0 or (pairs and every > 1 and step % every == 1)

    def _install_hook(self) -> None:
        try:
            # A lambda: DDP rejects a hook whose annotations are not its own types, and this
            # module's annotations are strings.
            self.model.register_comm_hook(None, lambda state, bucket: self._hook(state, bucket))
            self._hooked = True
        except RuntimeError as exc:  # e.g. the script registered a hook of its own
            self.unsupported = f"cannot add the noise-scale hook to DDP: {exc}"

    def _hook(self, state: Any, bucket: Any) -> Any:
        group = state if state is not None else dist.group.WORLD
        buf = bucket.buffer()
        if not self.measuring:
            buf.div_(self.world)
            fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])
        local = buf.square().sum().reshape(1)
        both = torch.cat([buf, local]).div_(self.world)
        fut = dist.all_reduce(both, group=group, async_op=True).get_future()

        def split(f: Any) -> Any:
            out = f.value()[0]
            grad = out[:-1]
            if self.rank == 0:  # only rank 0 publishes
                self._small.append(out[-1])
                self._big.append(grad.square().sum())
            return grad

        return fut.then(split)

    # ---- one rank ----------------------------------------------------------------------------
    def after_backward(self, micro_index: int, micro_count: int, weight: float) -> None:
        """One rank: read the gradients after a micro-batch's backward (run.backward)."""
        if not self.measuring or self.world > 1:
            return
        if micro_count == 1:  # copied: zero_grad(set_to_none=False) would zero them in place
            self._now = [g.clone() for g in self._grads()]
            return
        # Each micro-batch's own gradient is the growth of the accumulated one; the mean of
        # their squared norms (weights undone) is the small-batch term: k samples of it per
        # step rather than one, for a quarter of the variance at four micro-batches.
        grads = self._grads()
        if micro_index == 0 or self._acc is None:
            own = grads
        else:
            own = [g - p for g, p in zip(grads, self._acc, strict=True)]
        self._small.append(_sumsq(own) / (weight * weight * micro_count))
        self._acc = [g.clone() for g in grads] if micro_index < micro_count - 1 else None
        if micro_index == micro_count - 1:
            self._big.append(_sumsq(grads))

    def step_done(self, batch: int, micro: int, accumulation: int,
                  alpha: float) -> dict[str, Number] | None:
        """At run.step: combine what the step measured; metrics for rank 0's record."""
        if not self.measuring or self.rank != 0:
            return None
        if self.world > 1:
            small, big = self._take()
            if small is None:
                return None
            return self.estimator.update(_num(small), batch / self.world, _num(big), batch,
                                         alpha)
        if accumulation > 1:
            small, big = self._take()
            if small is None:
                return None
            return self.estimator.update(_num(small), micro, _num(big), batch, alpha)
        # Without run.backward the gradients are read here (zero them before the backward,
        # not before run.step, for this fallback to see them).
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
        return self.estimator.update(_num(small), batch, _num(_sumsq(mean)), 2 * batch, alpha)

    def _grads(self) -> list[Any]:
        return [p.grad.detach() for p in self.params if p.grad is not None]

    def _take(self) -> tuple[Any, Any]:
        small, big = self._small, self._big
        self._small, self._big = [], []
        if not small or not big:
            return None, None
        return sum(small), sum(big)


def _sumsq(tensors: list[Any]) -> Any:
    if not tensors:
        return torch.zeros(())
    return torch.stack([t.float().square().sum() for t in tensors]).sum()


def _num(v: Any) -> Number:
    """A CPU scalar as a float (free); a device scalar stays a tensor (no sync)."""
    if isinstance(v, torch.Tensor) and v.device.type == "cpu":
        return float(v)
    return v


class RankTimes:
    """Mean step and data-wait time of every rank since the last gather, so a straggler
    shows. Gathered at a sync point (one small all-reduce every ``monitor_ranks`` steps)."""

    def __init__(self, group: Any, world: int, rank: int) -> None:
        self.group, self.world, self.rank = group, world, rank
        self._step = self._data = 0.0
        self._n = 0
        self.last = 0

    def add(self, step_time: float, data_time: float) -> None:
        self._step += step_time
        self._data += data_time
        self._n += 1

    def due(self, step: int, every: int) -> bool:
        return every > 0 and step - self.last >= every

    def gather(self, step: int) -> dict[str, float]:
        t = torch.zeros(2 * self.world, dtype=torch.float64)
        n = max(self._n, 1)
        t[2 * self.rank], t[2 * self.rank + 1] = self._step / n, self._data / n
        self._step = self._data = 0.0
        self._n, self.last = 0, step
        if self.world > 1:
            dist.all_reduce(t, group=self.group)
        values = t.tolist()
        out = {}
        for r in range(self.world):
            out[f"step_time_r{r}"], out[f"data_time_r{r}"] = values[2 * r], values[2 * r + 1]
        steps = sorted(values[0::2])
        median = steps[len(steps) // 2]
        out["straggler"] = steps[-1] / median if median > 0 else 1.0
        return out
