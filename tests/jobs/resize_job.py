"""A DDP job for the resize and sync tests: what every step used, on every rank of every
size.

Runs under torchrun (2 ranks on gloo, then whatever the test resizes it to). Each rank of
each torchrun start appends one line per step to ``steps/<pid>.jsonl`` in the run directory
(step, world, rank, the sample indices, lr, the sync mode the step ran in, a digest of the
parameters after it), line-buffered, because a resize ends the
process inside ``run.step()``. Rank 0 writes the final parameters to ``final.json``.
"""

import argparse
import hashlib
import json
import os
import resource
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=1024)
p.add_argument("--epochs", type=int, default=2)
# This rank dies by SIGABRT once it has left for a resize, as torch + gloo sometimes make a
# rank do at teardown ("terminate called without an active exception").
p.add_argument("--abort-leaving", type=int, default=None)
a = p.parse_args()

run = hpi.init(hparams={"lr": 0.05, "momentum": 0.9, "batch_size": 16, "sleep": 0.0})


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] + self.x[:, 1] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]


torch.manual_seed(0)  # the same start on every rank and size (a resumed run loads its own)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.watch(model, opt)
loader = run.dataloader(Data(a.n), seed=1)
os.makedirs(os.path.join(run.run_dir.path, "steps"), exist_ok=True)
log = open(os.path.join(run.run_dir.path, "steps", f"{os.getpid()}.jsonl"), "w", buffering=1)  # noqa: SIM115 (a resize leaves inside run.step)
try:
    for _epoch in run.epochs(a.epochs):
        for idx, x, y in loader:
            step, sync = run.step_index, run.hp["sync"]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            log.write(json.dumps({"step": step, "world": run.world_size, "rank": run.rank,
                                  "idx": idx.tolist(), "lr": opt.param_groups[0]["lr"],
                                  "micro": run.micro_batch, "acc": run.accumulation}) + "\n")
            time.sleep(run.hp["sleep"])
            run.step(loss=loss)  # model averaging happens in here, after the optimizer's step
            flat = torch.cat([q.detach().flatten() for q in model.module.parameters()])
            log.write(json.dumps({"after": step, "rank": run.rank, "sync": sync,
                                  "digest": hashlib.sha1(flat.numpy().tobytes()).hexdigest()})
                      + "\n")
except SystemExit:
    if run.rank == a.abort_leaving and run.world_size > 1:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
        os.abort()
    raise

if run.rank == 0:
    flat = torch.cat([q.detach().flatten() for q in model.module.parameters()]).tolist()
    with open(os.path.join(run.run_dir.path, "final.json"), "w") as f:
        json.dump(flat, f)
run.finish()
