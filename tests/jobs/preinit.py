"""An existing DDP script: it initialises the process group itself, then adds hpinteract.
Run directly under torchrun (not through hpi.launch) by the tests."""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi

dist.init_process_group("gloo")
run = hpi.init(hparams={"lr": 0.1, "batch_size": 8})
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.watch(model, opt)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
for _ in run.epochs(10_000):
    for x, y in run.dataloader(data):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        time.sleep(0.003)
        run.step(loss=loss)
run.finish()
assert dist.is_initialized()  # hpinteract leaves the script's own process group alone
dist.destroy_process_group()
