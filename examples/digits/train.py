"""Train a small MLP on scikit-learn's bundled digits with DDP, tunable live by hpinteract.

Run it with ``hpi.launch("examples/digits/train.py", nproc=2)``, with
``hpinteract run examples/digits/train.py --nproc 2``, or directly with
``torchrun --standalone --nproc-per-node 2 examples/digits/train.py``.
Uses NCCL and one GPU per rank where there are GPUs, gloo on the CPU otherwise.
"""

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=40)
parser.add_argument("--hidden", type=int, default=256)
args = parser.parse_args()

run = hpi.init(
    hparams={"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4, "batch_size": 32},
    specs={"label_smoothing": hpi.HParam(0.0, low=0.0, high=0.5, doc="cross-entropy smoothing")},
)

digits = load_digits()  # 1,797 8x8 images, shipped with scikit-learn: nothing downloaded
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)
g = torch.Generator().manual_seed(0)
order = torch.randperm(len(x), generator=g)
train_idx, test_idx = order[:1500], order[1500:]
train = torch.utils.data.TensorDataset(x[train_idx], y[train_idx])
x_test, y_test = x[test_idx].to(run.device), y[test_idx].to(run.device)

torch.manual_seed(0)  # the same initial weights on every rank
model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden),
                      nn.ReLU(), nn.Linear(args.hidden, 10)).to(run.device)
model = DDP(model, device_ids=[run.device.index] if run.device.type == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
run.watch(model, optimizer)
loader = run.dataloader(train, seed=0)

for epoch in run.epochs(args.epochs):
    for xb, yb in loader:
        xb, yb = xb.to(run.device, non_blocking=True), yb.to(run.device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = nn.functional.cross_entropy(logits, yb,
                                           label_smoothing=run.hp["label_smoothing"])
        loss.backward()
        optimizer.step()
        run.step(loss=loss, acc=(logits.argmax(1) == yb).float().mean())
    with torch.no_grad():  # every rank holds the whole test split: the same numbers on all
        logits = model.module(x_test)
        run.log_eval(val_loss=nn.functional.cross_entropy(logits, y_test),
                     val_acc=(logits.argmax(1) == y_test).float().mean())

with torch.no_grad():
    test_acc = (model(x_test).argmax(1) == y_test).float().mean().item()
if run.rank == 0:
    print(f"test accuracy {test_acc:.3f} after {run.step_index} steps")
run.finish()
