"""A 2-rank job that computes, next to the noise-scale monitor, the same quantities by hand.

Runs under hpi.launch (2 ranks, gloo). Before each backward every rank takes its own
gradient with autograd on a copy of the unwrapped module (no communication), the ranks all-gather
them, and rank 0 writes the per-step mean over ranks of their own |g|^2 and |mean g|^2
to expected.json.
"""

import copy
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi

run = hpi.init(hparams={"lr": 0.05, "batch_size": 16, "monitor_gns": 1, "gns_smoothing": 0.9})
g = torch.Generator().manual_seed(1)
X = torch.randn(160, 4, generator=g)
Y = X @ torch.randn(4, 1, generator=g) + torch.randn(160, 1, generator=g)
torch.manual_seed(0)
net = nn.Linear(4, 1)
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
run.watch(model, opt)
expected = []
for _epoch in run.epochs(5):
    for x, y in run.dataloader(torch.utils.data.TensorDataset(X, Y), seed=2):
        ref = copy.deepcopy(net)  # a copy: the monitor's hooks must see only the real backward
        local = torch.autograd.grad(nn.functional.mse_loss(ref(x), y), list(ref.parameters()))
        flat = torch.cat([t.reshape(-1) for t in local])
        every = [torch.zeros_like(flat) for _ in range(run.world_size)]
        dist.all_gather(every, flat)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        small = sum(float(v.square().sum()) for v in every) / len(every)  # ranks' mean
        big = float(torch.stack(every).mean(0).square().sum())
        expected.append({"step": run.step_index, "small": small, "big": big,
                         "b_small": len(x), "b_big": len(x) * run.world_size})
        run.step(loss=loss)
if run.rank == 0:
    with open(os.path.join(run.run_dir.path, "expected.json"), "w") as f:
        json.dump(expected, f)
run.finish()
