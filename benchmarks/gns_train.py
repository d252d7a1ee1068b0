"""The noise-scale accuracy benchmark's job: least squares at fixed weights, known answer.

Runs under torchrun (every rank). y = x.w* + noise with x ~ N(0, I_n) and Gaussian noise of
standard deviation sigma; the model is linear without bias, held at w = w* + d (lr 0), so
the true gradient and the per-sample gradient covariance are constant and known:
per-sample gradient g = 2 x (x.d - noise), G = 2 d, tr(Sigma) = 4((n+1)|d|^2 + n sigma^2),
so B_simple = ((n+1)|d|^2 + n sigma^2) / |d|^2. The monitor runs at every step.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi

p = argparse.ArgumentParser()
p.add_argument("--features", type=int, default=8)
p.add_argument("--sigma", type=float, default=2.0)
p.add_argument("--steps", type=int, default=400)
a = p.parse_args()

run = hpi.init(hparams={"lr": 0.0, "batch_size": 32, "monitor_gns": 1})
g = torch.Generator().manual_seed(0)
n = a.features
w_star = torch.randn(n, 1, generator=g)
d = torch.randn(n, 1, generator=g)
d /= d.norm()  # |d|^2 = 1
samples = a.steps * int(run.hp["batch_size"])
X = torch.randn(samples, n, generator=g)
Y = X @ w_star + a.sigma * torch.randn(samples, 1, generator=g)
net = nn.Linear(n, 1, bias=False)
with torch.no_grad():
    net.weight.copy_((w_star + d).T)
model = DDP(net) if run.world_size > 1 else net
opt = torch.optim.SGD(model.parameters(), lr=0.0)
run.watch(model, opt)
for _epoch in run.epochs(1):
    for x, y in run.dataloader(torch.utils.data.TensorDataset(X, Y), seed=1):
        loss = nn.functional.mse_loss(model(x), y)
        if run.backward(loss):
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
run.finish()
