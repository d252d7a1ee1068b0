"""How much of the noise-scale monitor's cost is arithmetic no exact estimator can skip.

Runs in: one process, one thread (no torchrun, no DDP): the step of one rank of
monitor_overhead.py's job (its models, its per-rank batch of 32 samples), timed three ways
in interleaved rounds, by the thread's CPU time:

- ``off``: forward, backward, SGD step;
- ``dots``: the same plus only the squared norms the estimator needs, each a numpy dot on
  a zero-copy view, nothing else: the rank's own gradient whole (in gradient hooks, as it
  must be read before DDP reduces it) and half of the reduced one (a rank's share of it
  with two ranks);
- ``monitor``: the same plus hpinteract's ``GNSMonitor`` as the job runs it at every step
  (``world=2``, rank 0: hooks, the share of the reduced gradient, the estimator, its
  asynchronous all-reduce every 16 steps on a one-rank gloo group).

off/dots is the best any exact monitor can do on this step; off/monitor what hpinteract
does; their gap the monitor's own overhead.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import _models as models
import numpy as np
import torch
import torch.distributed as dist
from _common import machine_facts
from sklearn.datasets import load_digits

from hpinteract.trainer.monitors import GNSMonitor

Step = Callable[[int], None]


def variants(kind: str, x: torch.Tensor, y: torch.Tensor) -> dict[str, Step]:
    """One model each (the same seed, so the same weights): the monitor keeps its hooks on
    its model's parameters between measured steps, as in the job."""
    sink: list[float] = []

    def setup() -> tuple[list[torch.nn.Parameter], Callable[[], None], Callable[[], None]]:
        model = models.build(kind)
        params = list(model.parameters())
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)

        def forward_backward() -> None:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()

        return params, forward_backward, opt.step

    _, fb_off, step_off = setup()

    def off(step: int) -> None:
        fb_off()
        step_off()

    p_dots, fb_dots, step_dots = setup()

    def own(grad: torch.Tensor) -> None:
        v = grad.numpy().reshape(-1)
        sink.append(float(np.dot(v, v)))

    for p in p_dots:
        p.register_hook(own)

    def dots(step: int) -> None:
        fb_dots()
        for p in p_dots:
            assert p.grad is not None
            v = p.grad.numpy().reshape(-1)[: p.numel() // 2]
            sink.append(float(np.dot(v, v)))
        sink.clear()
        step_dots()

    p_mon, fb_mon, step_mon = setup()
    monitor = GNSMonitor(None, p_mon, world=2, rank=0)

    def monitored(step: int) -> None:
        monitor.arm(step, 1, 1)
        fb_mon()
        monitor.after_backward(0, 1, 1.0)
        monitor.step_done(step, 64, 32, 1, 0.95)
        step_mon()

    return {"off": off, "dots": dots, "monitor": monitored}


def cpu_ms_per_step(step: Step, n: int, start: int) -> float:
    t = time.thread_time()
    for i in range(start, start + n):
        step(i)
    return (time.thread_time() - t) / n * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--steps", type=int, default=1000, help="timed steps per variant and round")
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args()
    torch.set_num_threads(1)  # a rank's share of a 2-core machine, as in the job
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29631")
    dist.init_process_group("gloo", rank=0, world_size=1)  # for the monitor's all-reduce
    print(machine_facts())
    xs, ys = load_digits(return_X_y=True)  # bundled with scikit-learn: no download
    x = torch.tensor(xs[:32] / 16.0, dtype=torch.float32)
    y = torch.tensor(ys[:32])
    print(f"one rank's step (32 samples), {a.rounds} rounds of {a.steps} steps a variant, "
          "thread CPU ms per step (medians over rounds)\n")
    print(f"{'model':6} {'off':>7} {'dots':>7} {'monitor':>8}   {'off/dots':>9} "
          f"{'off/monitor':>12}   monitor - dots (the monitor's own overhead)")
    spread: dict[str, tuple[float, ...]] = {}
    for kind in a.models.split(","):
        steps = variants(kind, x, y)
        for v in steps.values():  # warm-up: allocator, caches, first hooks
            cpu_ms_per_step(v, 100, 0)
        ms: dict[str, list[float]] = {v: [] for v in steps}
        for r in range(a.rounds):
            order = list(steps) if r % 2 == 0 else list(reversed(steps))
            for v in order:
                ms[v].append(cpu_ms_per_step(steps[v], a.steps, r * a.steps))
        med = {v: statistics.median(t) for v, t in ms.items()}
        floors = [o / d for o, d in zip(ms["off"], ms["dots"], strict=True)]
        ratios = [o / m for o, m in zip(ms["off"], ms["monitor"], strict=True)]
        extra = statistics.median(m - d for m, d in zip(ms["monitor"], ms["dots"], strict=True))
        print(f"{kind:6} {med['off']:7.3f} {med['dots']:7.3f} {med['monitor']:8.3f}   "
              f"{statistics.median(floors):9.4f} {statistics.median(ratios):12.4f}   "
              f"{extra * 1e3:+.0f} us a step")
        spread[kind] = (min(floors), max(floors), min(ratios), max(ratios))
    print("\nper-round spread: " + "; ".join(
        f"{k} off/dots {lo:.3f}-{hi:.3f}, off/monitor {lo2:.3f}-{hi2:.3f}"
        for k, (lo, hi, lo2, hi2) in spread.items()))
    print("off/dots: the throughput ratio an exact monitor at every step cannot beat on this "
          "step;\noff/monitor: hpinteract's, in one process (the job adds DDP and the other "
          "rank: see monitor_overhead.py)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
