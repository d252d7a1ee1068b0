"""The GPU checks, prepared as one short script for a machine with CUDA devices: NCCL ranks
with one GPU each, a change applied on every rank at one step, model averaging switched on
and off, a resize, and the steps a second in each phase. ``--cpu`` runs the same on gloo
ranks, which is how it is tested where no GPU is lent.

Runs in: a driver process (no arguments but the options below), which launches this same
file as the job: under torchrun (``RANK`` set) it trains an MLP on generated data, its
model and batches on the rank's device.

Usage: .venv/bin/python benchmarks/gpu_check.py [--cpu] [--nproc 2]
(exits 2 without CUDA unless --cpu; 1 if a check fails)
"""

from __future__ import annotations

import argparse
import os
import sys


def job() -> None:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hpinteract as hpi

    run = hpi.init(hparams={"lr": 0.05, "momentum": 0.9, "batch_size": 512})
    dev = run.device
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                        nn.Linear(1024, 10)).to(dev)
    model = DDP(net, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run.watch(model, opt)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(65536, 256, generator=g)
    loader = run.dataloader(torch.utils.data.TensorDataset(x, x[:, :10].argmax(1)), seed=0)
    for _ in run.epochs(10**6):
        for xb, yb in loader:
            xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            run.step(loss=loss.detach())  # a tensor: read on the coordinator, no sync here
    run.finish()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="gloo ranks on CPU (a dry run)")
    ap.add_argument("--nproc", type=int, default=2)
    a = ap.parse_args()
    import torch
    from _common import job_env, machine_facts, private_home, steps_per_s, wait_step

    import hpinteract as hpi

    gpus = torch.cuda.device_count()
    if not a.cpu and gpus < 1:
        print("no CUDA device here: run with --cpu for a dry run on gloo", file=sys.stderr)
        return 2
    n = a.nproc if a.cpu else min(a.nproc, gpus)
    home = private_home()
    print(machine_facts())
    print(f"gpu_check: {n} ranks, {'gloo/CPU' if a.cpu else f'nccl, {gpus} GPU(s)'}\n")
    env = {**job_env(), **({"CUDA_VISIBLE_DEVICES": ""} if a.cpu else {})}
    job = hpi.launch(__file__, nproc=n, env=env, home=home,
                     backend="gloo" if a.cpu else "nccl")
    failures: list[str] = []
    marks = [0]

    wait_step(job, 30)
    ack = job.set(lr=0.01)
    steps = job.applied_steps(ack.change_id, timeout=10)
    print(f"set lr=0.01: applied at step {ack.applied_at_step} on ranks {steps}")
    if set(steps.values()) != {ack.applied_at_step} or len(steps) != n:
        failures.append(f"lr applied at {steps}, acknowledged at {ack.applied_at_step}")
    marks.append(ack.applied_at_step)
    if n > 1:
        wait_step(job, ack.applied_at_step + 60)
        ma = job.set(sync="model_averaging", averaging_period=8)
        wait_step(job, ma.applied_at_step + 60)
        back = job.set(sync="ssgd")
        marks += [ma.applied_at_step, back.applied_at_step]
        wait_step(job, back.applied_at_step + 60)
        down = job.resize(1)
        wait_step(job, down.applied_at_step + 60)
        up = job.resize(n)
        marks += [down.applied_at_step, up.applied_at_step]
        wait_step(job, up.applied_at_step + 60)
    job.stop()
    state = job.wait(120).value
    if state != "finished":
        failures.append(f"the job {state}: {job.error}")
    ev = job.events()
    if "status" in ev:
        for d in ev[(ev.kind == "resize") & (ev.status == "done")].to_dict("records"):
            print(f"resize {int(d['from'])} -> {int(d['to'])}: {d['total_s']:.2f} s (checkpoint "
                  f"{d['checkpoint_s']:.2f}, restart {d['restart_s']:.2f}, first step "
                  f"{d['first_step_s']:.2f})")
    ends = [*marks[1:], int(job.metrics().step.max()) + 1]
    names = ["start", "lr 0.01", "model averaging", "ssgd", "1 rank", f"{n} ranks"]
    print("steps/s: " + ", ".join(f"{nm} {steps_per_s(job, s, e, skip=5):.0f}"
                                  for nm, s, e in zip(names, marks, ends, strict=False)))
    print("\n" + ("checks passed" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    if os.environ.get("RANK") is not None:
        job()
    else:
        sys.exit(main())
