"""AdaptDL's side of the goodput benchmark: ``AdaptiveDataLoader.autoscale_batch_size`` and
``AdaptiveDataParallel`` (AdaScale for SGD, its default) on a task of goodput_tasks.py.

Runs in: each of two plain processes the driver (benchmarks/goodput.py) starts in AdaptDL's
own venv (AdaptDL 0.2.11 runs locally from its ``ADAPTDL_*`` environment variables, no
Kubernetes). The loop is the one AdaptDL documents; what it measures is the same as
goodput_train.py's: every ``eval_every`` samples the metric, the training wall time so far
(evaluations excluded), the samples and the batch in force, one JSON line each from rank
0 into ``--out``; both ranks stop at the same evaluation once the target is reached (their
models are identical).

AdaptDL refits its throughput model, and so may change the batch, only every 30 s of
training (a literal in ``adaptdl/torch/_metrics.py``), and a new batch takes effect at the
next pass over the data. ``--refit-s`` shortens the 30 s (by backdating its last fit), so
that tasks of seconds see AdaptDL adapt too: a variant that can only help it.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np

# AdaptDL 0.2.11's GoodputFunction.optimize uses np.int, gone since numpy 1.24.
if not hasattr(np, "int"):
    np.int = int  # type: ignore[attr-defined]

import adaptdl.env
import adaptdl.torch as adl
import adaptdl.torch._metrics as adl_metrics
import goodput_tasks as tasks
import torch

p = argparse.ArgumentParser()
p.add_argument("--task", choices=sorted(tasks.TASKS), required=True)
p.add_argument("--data", type=Path, required=True)
p.add_argument("--out", type=Path, required=True)
p.add_argument("--steps", type=int, default=None,
               help="the cost of a step: this many steps at --batch, then the median")
p.add_argument("--batch", type=int, default=None, help="with --steps: the global batch")
p.add_argument("--refit-s", type=float, default=None,
               help="refit AdaptDL's throughput model every S s (as released: every 30 s)")
a = p.parse_args()
task = tasks.TASKS[a.task]
torch.set_num_threads(1)
# AdaptDL's optimizer wrapper warns at each zero_grad it skips while accumulating.
warnings.filterwarnings("ignore", message="skipping zero_grad")

adl.init_process_group("gloo")
rank = adaptdl.env.replica_rank()
d = tasks.load(a.task, a.data)
replicas = adaptdl.env.num_replicas()
start = a.batch if a.steps else task.start
loader = adl.AdaptiveDataLoader(torch.utils.data.TensorDataset(d["x"], d["y"]),
                                batch_size=start, shuffle=True, drop_last=True)
if a.steps:  # its goodput machinery on, held at one batch (nothing else it may choose)
    loader.autoscale_batch_size(start, local_bsz_bounds=(start // replicas,
                                                         start // replicas))
else:
    loader.autoscale_batch_size(task.max_batch, local_bsz_bounds=(1, task.max_micro),
                                gradient_accumulation=True)
net = tasks.model(a.task)
opt = torch.optim.SGD(net.parameters(), lr=task.lr, momentum=0.9)
model = adl.AdaptiveDataParallel(net, opt)
budget = task.epochs * len(d["x"])  # samples, as goodput_train.py's epochs give
# --steps: the cost of a step, as goodput_train.py measures it
clock = tasks.StepClock(a.steps) if a.steps else None
train_time, seen, next_eval, done = 0.0, 0, task.eval_every, False
out = open(a.out, "w") if rank == 0 else None  # noqa: SIM115
t = time.perf_counter()
# AdaptDL counts its epochs in statistical progress (a pass at the initial batch): the
# budget in samples ends the run instead.
for _epoch in adl.remaining_epochs_until(10**6):
    for x, y in loader:
        opt.zero_grad()
        tasks.loss(a.task, model(x), y).backward()
        opt.step()
        if clock is not None:
            done = clock.tick()
            if done:
                break
            continue
        if a.refit_s is not None:
            # AdaptDL refits on rank 0 when its last fit (_PREV_REPORT) is 30 s old, as it
            # is about to after this step: backdating it by 30 s makes that every refit_s.
            prev = adl_metrics._PREV_REPORT
            if prev is not None and time.time() - prev >= a.refit_s:
                adl_metrics._PREV_REPORT = prev - 30
        seen += len(x) * adaptdl.env.num_replicas()
        if seen >= next_eval:
            train_time += time.perf_counter() - t
            next_eval += task.eval_every
            value = tasks.evaluate(a.task, net, d)
            done = (value >= task.target if task.higher else value <= task.target) \
                or seen >= budget
            if out is not None:
                out.write(json.dumps({
                    "train_time": train_time, "samples": seen, task.metric: value,
                    "batch_size": loader.current_batch_size,
                    "micro": loader.current_local_bsz,
                    "accumulation": loader.accumulation_steps + 1}) + "\n")
                out.flush()
            t = time.perf_counter()
            if done:
                break
    if done:
        break
if out is not None:
    if clock is not None:
        out.write(json.dumps({"step_ms": clock.median_ms()}) + "\n")
    out.close()
