"""The benchmarks' training job: one model, one data set, one loop, with or without hpinteract.

Runs under torchrun (every rank). ``--mode plain`` is ordinary DDP: DistributedSampler +
DataLoader with the per-rank batch. ``--mode hpi`` is the same loop instrumented as the
README shows: ``hpi.init``, ``run.watch``, ``run.dataloader`` and ``run.step(loss=, acc=)``
after every optimizer step. Everything else (model, seed, optimizer, batch, samples per
step, the per-step work in the loop) is shared, so the two differ only by hpinteract.

Rank 0 times the steady state, from the end of step ``--warmup`` to the end of step
``--warmup + --steps``, and writes it as JSON to ``--out``. ``--steps 0`` trains until the
job is stopped (the latency benchmark stops it with ``job.stop()``; hpi mode only).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import _models as models
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("plain", "hpi"), required=True)
p.add_argument("--steps", type=int, default=1500, help="timed steps (0: until stopped)")
p.add_argument("--warmup", type=int, default=200, help="untimed steps first")
p.add_argument("--batch", type=int, default=64, help="global batch")
p.add_argument("--hidden", type=int, default=512)
p.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
               help="see _models.build: mlp, the least compute per weight, or cnn")
p.add_argument("--out", default=None, help="JSON file rank 0 writes its timing to")
p.add_argument("--sync-every", type=int, default=None,
               help="hpi.init(sync_every=...): steps between control sync points (default auto)")
a = p.parse_args()

LR, MOMENTUM, SEED = 0.05, 0.9, models.SEED


def digits() -> TensorDataset:
    x, y = load_digits(return_X_y=True)  # bundled with scikit-learn: no download
    return TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))


def make_model() -> nn.Module:
    return models.build(a.model, a.hidden)


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each of this process's threads, by name (Linux /proc; else {})."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # a thread that just ended
        fields = stat.rsplit(")", 1)[1].split()
        name = names.get(int(tid)) or stat[stat.index("(") + 1 : stat.rindex(")")]
        name = "training thread" if name == "MainThread" else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    # Rank 0's coordinator process (a child of this one; all its threads together).
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if pid.isdigit() and int(fields[1]) == os.getpid() and "hpi-coordinator" in stat:
            out["hpi-coordinator"] = out.get("hpi-coordinator", 0.0) + (
                int(fields[11]) + int(fields[12])) / tick
    return out


class Timer:
    """Rank 0's stopwatch over the timed window; per-step durations for the tail; every
    rank's CPU time over the same window, in total and by thread."""

    def __init__(self) -> None:
        self.done = 0
        self.t0 = self.t1 = self.last = 0.0
        self.cpu0 = self.cpu1 = 0.0  # this process's CPU seconds, all its threads
        self.threads0: dict[str, float] = {}
        self.threads1: dict[str, float] = {}
        self.durations: list[float] = []

    def tick(self) -> bool:
        """After each step; True once the timed window is over."""
        self.done += 1
        if self.done == a.warmup:
            self.threads0 = thread_cpu()
            self.cpu0 = time.process_time()
            self.t0 = self.last = time.perf_counter()
        elif self.done > a.warmup:
            now = time.perf_counter()
            self.durations.append(now - self.last)
            self.last = now
            if a.steps and self.done == a.warmup + a.steps:
                self.t1 = now
                self.cpu1 = time.process_time()
                self.threads1 = thread_cpu()
                return True
        return False

    def report(self, rank: int, world: int, extra: dict) -> None:
        # CPU time is a cost that another process's load hardly changes, unlike the wall
        # clock. Gathered with a collective, after the window.
        if not self.t1:  # stopped from outside (--steps 0): the window ends now
            self.cpu1, self.threads1 = time.process_time(), thread_cpu()
        threads = {k: v - self.threads0.get(k, 0.0) for k, v in self.threads1.items()}
        mine = {"cpu": self.cpu1 - self.cpu0, "threads": threads}
        ranks: list[dict] = [{}] * world
        dist.all_gather_object(ranks, mine)
        if rank != 0 or not a.out or not self.durations:
            return
        t1 = self.t1 or self.last
        n = len(self.durations)
        d = sorted(self.durations)
        rec = {"mode": a.mode, "world_size": world, "steps": n, "warmup": a.warmup,
               "batch": a.batch, "seconds": t1 - self.t0, "steps_per_s": n / (t1 - self.t0),
               "ms_per_step": 1e3 * (t1 - self.t0) / n, "p50_ms": 1e3 * d[n // 2],
               "p99_ms": 1e3 * d[min(n - 1, int(0.99 * n))], "max_ms": 1e3 * d[-1],
               "cpu_ms_per_step": 1e3 * sum(r["cpu"] for r in ranks) / n,
               "rank_threads_ms_per_step": [{k: 1e3 * v / n for k, v in r["threads"].items()}
                                            for r in ranks], **extra}
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, a.out)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    loss.backward()
    opt.step()
    return loss.detach(), (out.detach().argmax(1) == y).float().mean()


def plain() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = digits()
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sampler = DistributedSampler(ds, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=a.batch // world, sampler=sampler, drop_last=True)
    timer, epoch, over = Timer(), 0, False
    while not over:
        sampler.set_epoch(epoch)
        for x, y in loader:
            train_step(model, opt, x, y)
            if timer.tick():
                over = True
                break
        epoch += 1
    timer.report(rank, world, {})
    dist.destroy_process_group()


def instrumented() -> None:
    import hpinteract as hpi

    run = hpi.init(hparams={"lr": LR, "momentum": MOMENTUM, "batch_size": a.batch},
                   sync_every=a.sync_every)
    ds = digits()
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    run.watch(model, opt)
    loader = run.dataloader(ds, seed=SEED, drop_last=True)
    timer, over, syncs0 = Timer(), False, 0
    for _epoch in run.epochs(10**9):
        for x, y in loader:
            loss, acc = train_step(model, opt, x, y)
            run.step(loss=loss, acc=acc)
            if timer.done + 1 == a.warmup:
                syncs0 = run._sync.syncs  # a diagnostic: sync points in the timed window
            if timer.tick():
                over = True
                break
        if over:
            break
    timer.report(run.rank, run.world_size, {"syncs": run._sync.syncs - syncs0})
    run.finish()


if __name__ == "__main__":
    if a.warmup < 1:
        p.error("--warmup must be at least 1 (the timed window starts after it)")
    if a.mode == "plain" and a.steps == 0:
        p.error("--steps 0 needs --mode hpi (a plain job cannot be stopped from outside)")
    if a.mode == "plain":
        plain()
    else:
        instrumented()
