"""hpinteract's side of the goodput benchmark: a static batch, or the ``goodput`` or
``adaptive_batch`` policy, on a task of goodput_tasks.py.

Runs under torchrun (every rank, hpi.launch). Every ``eval_every`` samples it evaluates on
rank 0's copy of the model and reports the metric, ``train_time`` (wall seconds of
training so far, evaluations excluded), ``samples`` and the ``batch`` in force through
``run.log_eval``, and stops at the first evaluation that reaches the task's target. With
``--steps N`` it measures the cost of a step instead: N steps at the batch it starts at
(goodput with a ``--min-gain`` that never switches), then the median step time past the
first fifth as ``step_ms``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import goodput_tasks as tasks
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi
from hpinteract.policies import AdaptiveBatchSize, Goodput

p = argparse.ArgumentParser()
p.add_argument("--task", choices=sorted(tasks.TASKS), required=True)
p.add_argument("--data", type=Path, required=True)
p.add_argument("--batch", type=int, default=None, help="the (first) global batch")
p.add_argument("--policy", choices=("static", "goodput", "adaptive"), default="static")
p.add_argument("--interval", type=int, default=None, help="goodput: steps between looks")
p.add_argument("--min-gain", type=float, default=None, help="goodput: the gain to switch")
p.add_argument("--monitor-every", type=int, default=1, help="goodput: monitor_gns")
p.add_argument("--gns-smoothing", type=float, default=None)
p.add_argument("--steps", type=int, default=None,
               help="the cost of a step: train this many steps, then report the median")
a = p.parse_args()
task = tasks.TASKS[a.task]
batch = a.batch or task.start

policies: list = []
if a.policy == "goodput":
    policies = [Goodput(max_batch=task.max_batch, max_micro_batch=task.max_micro,
                        monitor_every=a.monitor_every,
                        **({"interval": a.interval} if a.interval else {}),
                        **({"min_gain": a.min_gain} if a.min_gain is not None else {}))]
elif a.policy == "adaptive":
    # Its defaults (lr_scaling adascale), as a user would add it; one micro-batch a rank,
    # so no more than max_micro samples a rank.
    policies = [(AdaptiveBatchSize(max_batch=min(task.max_batch, 2 * task.max_micro),
                                   min_batch=batch), 10)]
hparams = {"lr": task.lr, "momentum": 0.9, "batch_size": batch,
           "monitor_gns": a.monitor_every if a.policy != "static" else 0}
if a.gns_smoothing is not None:
    hparams["gns_smoothing"] = a.gns_smoothing
if a.policy == "goodput":  # it splits a rank's share into micro-batches where it pays
    hparams["micro_batch"] = min(task.max_micro, batch // int(os.environ["WORLD_SIZE"]))
run = hpi.init(hparams=hparams, policies=policies)
d = tasks.load(a.task, a.data)
net = tasks.model(a.task)
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=run.hp["lr"], momentum=0.9)
run.watch(model, opt)
loader = run.dataloader(torch.utils.data.TensorDataset(d["x"], d["y"]), seed=0, drop_last=True)
# --steps: the cost of a step, with no evaluation and no target
clock = tasks.StepClock(a.steps) if a.steps else None
train_time, seen, next_eval = 0.0, 0, task.eval_every
t = time.perf_counter()
for _epoch in run.epochs(task.epochs):
    for x, y in loader:  # micro-batches: the step's last says so (run.backward)
        if not run.backward(tasks.loss(a.task, model(x), y)):
            continue
        opt.step()
        opt.zero_grad(set_to_none=True)
        run.step()
        if clock is not None:
            if clock.tick():
                break
            continue
        seen += int(run.hp["batch_size"])
        if seen >= next_eval:
            train_time += time.perf_counter() - t
            next_eval += task.eval_every
            value = tasks.evaluate(a.task, net, d)
            run.log_eval(**{task.metric: value}, train_time=train_time, samples=seen,
                         batch=int(run.hp["batch_size"]))
            t = time.perf_counter()
            # Every rank evaluates its identical model: all stop at the same step.
            if value >= task.target if task.higher else value <= task.target:
                break
    else:
        continue
    break
if clock is not None:
    run.log_eval(step_ms=clock.median_ms())
run.finish()
