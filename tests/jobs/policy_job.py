"""A 2-rank noisy regression job for the policy tests.

Runs under hpi.launch. ``--adaptive`` starts hpi.init with an AdaptiveBatchSize policy (the
built-in path from the script); otherwise policies come from the tests' clients. Each rank
records, per step, the lr and local batch it used, so tests can check consistency.
"""

import argparse
import json
import os
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi
from hpinteract.policies import AdaptiveBatchSize

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=1000)
p.add_argument("--adaptive", action="store_true")
a = p.parse_args()

policies = [AdaptiveBatchSize(max_batch=64, patience=1, cooldown=3, lr_scaling="linear",
                              target=1.0)] if a.adaptive else []
run = hpi.init(hparams={"lr": 0.01, "batch_size": 16, "sleep": 0.002}, policies=policies)
g = torch.Generator().manual_seed(0)
X = torch.randn(2048, 8, generator=g)
Y = X @ torch.randn(8, 1, generator=g) + 2.0 * torch.randn(2048, 1, generator=g)
torch.manual_seed(0)
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
run.watch(model, opt)
loader = run.dataloader(torch.utils.data.TensorDataset(X, Y), seed=1)
trace = []
for _epoch in run.epochs(a.epochs):
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        trace.append({"step": run.step_index, "lr": opt.param_groups[0]["lr"],
                      "local_batch": len(x)})
        time.sleep(run.hp["sleep"])
        run.step(loss=loss)
    run.log_eval(val_loss=nn.functional.mse_loss(model(X[:256]), Y[:256]).item())
with open(os.path.join(run.run_dir.path, f"trace_{run.rank}.json"), "w") as f:
    json.dump(trace, f)
run.finish()
