"""The adaptive-batch benchmark's job: a teacher-student classification or a noisy
quadratic, static or adaptive.

Runs under torchrun (every rank). Data are generated here (no download): 4 classes of 16-d
Gaussian inputs labelled by a random teacher MLP, 5 % of labels flipped, 262,144 samples
seen once (an epoch is 8,192 steps at batch 32), so this is optimisation of the population
loss: the gradient noise scale grows as the student fits (59 at the start, thousands
later), and a larger batch pays off later in training. The same model, optimizer, seeds
and lr for every run (``--lr-rule fixed``: more samples per step lower the noise, as a
decaying lr would; ``linear``: lr = lr0 * batch / 32; ``adascale``: lr0, and the
policy's changes of the batch move it by AdaScale); ``--adaptive`` adds the
AdaptiveBatchSize policy from ``--batch`` up to ``--max-batch``; ``--sync model_averaging``
trains with local steps and the ranks' models averaged every ``--period`` steps (sync.py).
Every ``--eval-every``
samples the job evaluates on held-out data and reports ``val_acc`` and ``train_time``
(wall seconds of training so far, evaluations excluded) through ``run.log_eval``.

``--task quadratic`` is the noisy quadratic model of batch-size studies (McCandlish et al.
2018, Zhang et al. 2019): least squares on 64 Gaussian features whose variances fall as
1/i (an ill-conditioned Hessian, as deep networks' are), labels from a fixed linear teacher
plus unit Gaussian noise, a linear model from zero. Its gradient noise scale starts near 15
and grows past 20,000 as the error in the flat directions shrinks, and at a fixed
lr a batch of B leaves an error floor proportional to lr / B: early steps want small
batches, the last digits of the loss large ones. It reports ``val_excess``, the population
loss above the noise (exact, from the known teacher: lower is better).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi
from hpinteract.policies import AdaptiveBatchSize

p = argparse.ArgumentParser()
p.add_argument("--task", choices=("teacher", "quadratic"), default="teacher")
p.add_argument("--batch", type=int, default=32)
p.add_argument("--adaptive", action="store_true")
p.add_argument("--max-batch", type=int, default=1024)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--samples", type=int, default=262144)
p.add_argument("--eval-every", type=int, default=8192, help="samples between evaluations")
p.add_argument("--lr0", type=float, default=0.05, help="lr (at batch 32 with --lr-rule linear)")
p.add_argument("--target", type=float, default=0.1, help="AdaptiveBatchSize(target=...)")
p.add_argument("--patience", type=int, default=3)
p.add_argument("--smoothing", type=float, default=0.99, help="gns_smoothing (EMA factor)")
p.add_argument("--cooldown", type=int, default=50)
p.add_argument("--lr-rule", choices=("fixed", "linear", "adascale"), default="fixed")
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--every", type=int, default=10, help="policy every N steps")
p.add_argument("--sync", choices=("ssgd", "model_averaging"), default="ssgd")
p.add_argument("--period", type=int, default=4, help="averaging_period (model_averaging)")
a = p.parse_args()

D, C, FLIP = 16, 4, 0.05
HIDDEN = a.hidden


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)  # the same teacher for train and test
    teacher = [torch.randn(D, 64, generator=g), torch.randn(64, C, generator=g)]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(1)
    flip = torch.rand(n, generator=g) < FLIP
    y[flip] = torch.randint(0, C, (int(flip.sum()),), generator=g)
    return x, y


QD = 64  # the quadratic's features
Q_VAR = 1.0 / torch.arange(1, QD + 1, dtype=torch.float32)  # feature variances: the Hessian
Q_TEACHER = 3.0 * torch.randn(QD, generator=torch.Generator().manual_seed(1234))


def make_quadratic(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, QD, generator=g) * Q_VAR.sqrt()
    return x, x @ Q_TEACHER + torch.randn(n, generator=g)


def excess(model: nn.Module) -> float:
    """The population loss above the noise's, 0.5 * sum_i var_i * (w_i - w*_i)^2."""
    err = model.weight.detach().reshape(-1) - Q_TEACHER
    return float(0.5 * (Q_VAR * err * err).sum())


policies = [(AdaptiveBatchSize(max_batch=a.max_batch, min_batch=a.batch, target=a.target,
                               patience=a.patience, cooldown=a.cooldown,
                               lr_scaling={"fixed": "none"}.get(a.lr_rule, a.lr_rule)),
             a.every)] if a.adaptive else []
lr = a.lr0 * a.batch / 32 if a.lr_rule == "linear" else a.lr0
run = hpi.init(hparams={"lr": lr, "momentum": 0.9, "batch_size": a.batch,
                        "monitor_gns": 1 if a.adaptive else 0, "gns_smoothing": a.smoothing,
                        "sync": a.sync,
                        "averaging_period": a.period}, policies=policies)
quadratic = a.task == "quadratic"
X, Y = (make_quadratic if quadratic else make_data)(a.samples, seed=1)
# The teacher task's held-out set, large so one evaluation's noise is ~0.3 % (the quadratic
# needs none: its excess loss is exact from the known teacher).
Xt, Yt = (None, None) if quadratic else make_data(16384, seed=2)
torch.manual_seed(0)
if quadratic:
    net: nn.Module = nn.Linear(QD, 1, bias=False)
    nn.init.zeros_(net.weight)
else:
    net = nn.Sequential(nn.Linear(D, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                        nn.Linear(HIDDEN, C))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=run.hp["lr"], momentum=0.9)
run.watch(model, opt)
loader = run.dataloader(torch.utils.data.TensorDataset(X, Y), seed=0, drop_last=True)
train_time, seen, next_eval = 0.0, 0, a.eval_every
t = time.perf_counter()
for _epoch in run.epochs(a.epochs):
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = (0.5 * nn.functional.mse_loss(out.squeeze(1), y) if quadratic
                else nn.functional.cross_entropy(out, y))
        loss.backward()
        opt.step()
        run.step(loss=loss.detach())
        seen += int(run.hp["batch_size"])
        if seen >= next_eval:
            train_time += time.perf_counter() - t
            next_eval += a.eval_every
            if quadratic:
                run.log_eval(val_excess=excess(model.module), train_time=train_time,
                             samples=seen)
            else:
                assert Xt is not None and Yt is not None
                with torch.no_grad():
                    acc = (model.module(Xt).argmax(1) == Yt).float().mean().item()
                run.log_eval(val_acc=acc, train_time=train_time, samples=seen)
            t = time.perf_counter()
run.finish()
