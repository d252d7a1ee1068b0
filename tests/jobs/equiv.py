"""A deterministic regression job for the batch-semantics tests.

Runs under hpi.launch with 1 or 2 ranks. The global batch, the seed and the data are fixed;
``micro_batch`` (and so the accumulation) and the number of ranks vary. After every step it
records the loss over the whole data set, which must not depend on how the batch was split.
"""

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi

run = hpi.init(hparams={"lr": 0.1, "batch_size": 32, "micro_batch": 8})
g = torch.Generator().manual_seed(0)
X = torch.randn(256, 8, generator=g)
Y = X @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(256, 1, generator=g)
data = torch.utils.data.TensorDataset(X, Y)

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
model = DDP(net) if run.world_size > 1 else net
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.watch(model, opt)
loader = run.dataloader(data, seed=3)
for _epoch in run.epochs(2):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        if run.backward(loss):
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                full = nn.functional.mse_loss(net(X), Y).item()
            run.step(loss=loss, full_loss=full)
run.finish()
