"""The goodput benchmark's tasks, shared by its two training scripts (hpinteract's,
goodput_train.py, and AdaptDL's, goodput_adaptdl.py), so that both train the same model on
the same data from the same start.

Runs in: every rank of either job (torch; neither hpinteract nor AdaptDL). The data come
from the driver (benchmarks/goodput.py ``make_data``) as one ``.npz`` file a task, made
once with numpy and scikit-learn's bundled digits: no download, and the same arrays for
both systems whatever their environments.

- ``digits``: scikit-learn's 8x8 digits (1,437 train, 360 held out, standardised), an MLP
  64-256-256-10, SGD with momentum 0.9; the metric is the held-out accuracy.
- ``quadratic``: the noisy quadratic of batch-size studies (64 Gaussian features of
  variance 1/i, labels from a fixed linear teacher plus unit noise, a linear model from
  zero); the metric is the excess population loss, exact from the known teacher.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Task:
    metric: str
    higher: bool  # accuracy-like (True) or loss-like
    target: float
    lr: float
    start: int  # the global batch every run starts at (AdaptDL's initial batch)
    max_batch: int
    max_micro: int  # samples a rank at once (AdaptDL's local_bsz_bounds' upper end)
    epochs: int
    eval_every: int  # samples between evaluations
    statics: tuple[int, ...]
    hidden: int = 256  # the MLP's width (digits)


TASKS = {
    "digits": Task("train_loss", False, 0.005, 0.01, 32, 1024, 256, 2000, 1437,
                   (32, 64, 128, 256, 512)),
    "quadratic": Task("val_excess", False, 0.002, 0.01, 64, 8192, 2048, 400, 16384,
                      (64, 128, 256, 512, 1024)),
}


class StepClock:
    """The cost of a step (both scripts' ``--steps N``): the wall time from one step's end
    to the next's, N of them, and their median past the first fifth (the warm-up)."""

    def __init__(self, steps: int) -> None:
        self.steps, self._last = steps, time.perf_counter()
        self.times: list[float] = []

    def tick(self) -> bool:
        """A step ended; whether that was the last one to time."""
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now
        return len(self.times) >= self.steps

    def median_ms(self) -> float:
        return 1e3 * statistics.median(self.times[len(self.times) // 5:])


def load(task: str, data: Path) -> dict[str, Any]:
    """The task's tensors (x, y, and the held-out set or the teacher)."""
    arrays = np.load(data)
    return {k: torch.from_numpy(arrays[k]) for k in arrays.files}


def model(task: str) -> nn.Module:
    torch.manual_seed(0)
    if task == "quadratic":
        net = nn.Linear(64, 1, bias=False)
        nn.init.zeros_(net.weight)
        return net
    h = TASKS[task].hidden
    return nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                         nn.Linear(h, 10))


def loss(task: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if task == "quadratic":
        return 0.5 * nn.functional.mse_loss(out.squeeze(1), y)
    return nn.functional.cross_entropy(out, y)


def evaluate(task: str, net: nn.Module, d: dict[str, Any]) -> float:
    with torch.no_grad():
        if task == "quadratic":
            err = net.weight.detach().reshape(-1) - d["teacher"]
            return float(0.5 * (d["var"] * err * err).sum())
        if TASKS[task].metric == "train_loss":
            return float(nn.functional.cross_entropy(net(d["x"]), d["y"]))
        return float((net(d["xt"]).argmax(1) == d["yt"]).float().mean())


def make_data(task: str, path: Path) -> None:
    """Write the task's arrays (the driver calls it once; numpy and scikit-learn only)."""
    if task == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        order = np.random.default_rng(0).permutation(len(x))
        x, y = x[order].astype(np.float32), y[order].astype(np.int64)
        mean, std = x[:1437].mean(0), x[:1437].std(0) + 1e-6
        x = (x - mean) / std
        np.savez(path, x=x[:1437], y=y[:1437], xt=x[1437:], yt=y[1437:])
        return
    g = np.random.default_rng(1234)
    teacher = (3.0 * g.standard_normal(64)).astype(np.float32)
    var = (1.0 / np.arange(1, 65)).astype(np.float32)
    n = 65536
    x = (g.standard_normal((n, 64)) * np.sqrt(var)).astype(np.float32)
    y = (x @ teacher + g.standard_normal(n)).astype(np.float32)
    np.savez(path, x=x, y=y, teacher=teacher, var=var)
