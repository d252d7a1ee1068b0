"""A tiny DDP job for the tests: records, on every rank, what each step actually used.

Runs under torchrun (2 ranks on gloo in the tests). Each rank writes trace_<rank>.json in
its run directory: per step the lr in the optimizer, the local batch, the sample indices
and a user hyper-parameter, so tests can check consistency across ranks.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=1000)
p.add_argument("--n", type=int, default=256)
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--crash-step", type=int, default=-1)
p.add_argument("--kill", action="store_true", help="die by SIGKILL instead of raising")
p.add_argument("--exit", type=int, default=0, help="sys.exit with this code instead of raising")
p.add_argument("--hang", type=float, default=0.0,
               help="instead of raising, sleep this long in the step (inf: for ever)")
p.add_argument("--seed", type=int, default=None, help="seed torch (the model's start)")
p.add_argument("--crash-always", action="store_true",
               help="crash on every torchrun attempt, not only the first")
a = p.parse_args()

run = hpi.init(
    hparams={"lr": 0.05, "momentum": 0.0, "batch_size": 16, "sleep": 0.002},
    specs={
        "dropout": hpi.HParam(0.1, low=0.0, high=0.9, doc="a user hyper-parameter"),
        "mode": hpi.HParam("a", choices=("a", "b")),
        "note": hpi.HParam("", doc="free text: a long one takes the control word's second round"),
    },
)


def stuck_in_user_code(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # the frame the hang report must name
        time.sleep(0.05)


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]


if a.seed is not None:
    torch.manual_seed(a.seed)
model = DDP(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.watch(model, opt)
loader = run.dataloader(Data(a.n), seed=1)
trace = []
for epoch in run.epochs(a.epochs):
    for idx, x, y in loader:
        step = run.step_index
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if run.rank == a.crash_rank and step == a.crash_step and (first_attempt
                                                                   or a.crash_always):
            if a.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            if a.exit:
                sys.exit(a.exit)
            if a.hang:
                stuck_in_user_code(a.hang)
            else:
                raise RuntimeError(f"boom on purpose at step {step}")
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        trace.append({"step": step, "epoch": epoch, "lr": opt.param_groups[0]["lr"],
                      "local_batch": len(idx), "idx": idx.tolist(),
                      "dropout": run.hp["dropout"], "mode": run.hp["mode"],
                      "note_len": len(run.hp["note"])})
        time.sleep(run.hp["sleep"])
        run.step(loss=loss, acc=(model(x).argmax(1) == y).float().mean())

with open(os.path.join(run.run_dir.path, f"trace_{run.rank}.json"), "w") as f:
    json.dump(trace, f)
run.finish()
