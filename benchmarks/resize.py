"""Resize latency: a running job changes its number of ranks (``job.resize(n)``), phase by
phase, next to a cold start of a job of the same size.

Runs in: a driver process, a client of the benchmarks' DDP job (train.py ``--mode hpi``,
gloo/CPU, OMP_NUM_THREADS=1). It launches the job with the first of ``--sizes`` ranks and
resizes it through the others (default 1 -> 2 -> 4 -> 2 -> 1), ``--settle`` seconds of
training between resizes. Every resize is timed by the job itself (the ``resize`` event its
new rank 0 posts after its first step):

- checkpoint: from the resize boundary to the old ranks' leaving (state captured and
  written, logs closed);
- restart: from there to the new rank 0 in ``hpi.init`` (the old processes' exit, torchrun
  started again, interpreters and torch imported, rendezvous); "exit" is its part until the
  supervisor relaunched torchrun;
- first step: the script's set-up to the end of its first step (model, data, restore);

and by the driver: the call to its acknowledgement (the step boundary) and the call to its
return (the resized job has stepped). The comparison, in the same run: a cold start of the
same script with the same number of ranks (``hpi.launch`` to the first step), so the ratio
resize / cold start says what a resize costs beyond starting the job anew. Steps/s at each
size come from the job's metrics log (its steps after the first 20 of each size).

KungFu reports about 20 s to scale from 1 to 2 workers (issue 7 asks for far lower).

Usage: .venv/bin/python benchmarks/resize.py [--sizes 1,2,4,2,1] [--settle 4]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _common import TRAIN, job_env, machine_facts, median, private_home, steps_per_s, wait_step

import hpinteract as hpi

ARGS = ["--mode", "hpi", "--steps", "0", "--warmup", "1000000000"]
KUNGFU_1_TO_2_S = 20.0


def cold_start(n: int, home: Path) -> float:
    t = time.monotonic()
    job = hpi.launch(TRAIN, nproc=n, args=ARGS, env=job_env(), home=home)
    wait_step(job, 0, timeout=120)
    took = time.monotonic() - t
    job.stop()
    job.wait(60)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,2,4,2,1")
    ap.add_argument("--settle", type=float, default=4.0, help="seconds between resizes")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    home = private_home()
    print(machine_facts())
    print(f"resize: train.py (MLP on digits, global batch 64, gloo/CPU), sizes {sizes}, "
          f"{a.settle:g} s of training between resizes\n", flush=True)

    job = hpi.launch(TRAIN, nproc=sizes[0], args=ARGS, env=job_env(), home=home)
    wait_step(job, 0, timeout=120)
    rows: list[dict[str, Any]] = []
    starts = [0]
    for n in sizes[1:]:
        time.sleep(a.settle)
        t = time.monotonic()
        ack = job.resize(n)
        rows.append({"call_s": time.monotonic() - t, "step": ack.applied_at_step})
        starts.append(ack.applied_at_step)
    time.sleep(a.settle)
    job.stop()
    job.wait(60)
    ev = job.events()
    done = ev[(ev.kind == "resize") & (ev.status == "done")].to_dict("records")
    ends = [*starts[1:], int(job.metrics().step.max()) + 1]
    rates = [steps_per_s(job, s, e) for s, e in zip(starts, ends, strict=True)]
    cold = {n: cold_start(n, home) for n in sorted(set(sizes))}

    print(f"{'resize':<10}{'checkpoint':>12}{'restart':>10}{'(exit)':>8}{'1st step':>10}"
          f"{'total':>9}"
          f"{'(call->return)':>16}{'cold start':>12}{'resize/cold':>13}")
    for d in done:
        n = int(d["to"])
        call = next(r for r in rows if r["step"] == d["step"])
        print(f"{int(d['from'])} -> {n:<5}{d['checkpoint_s']:>11.2f}s{d['restart_s']:>9.2f}s"
              f"{d['exit_s']:>7.2f}s"
              f"{d['first_step_s']:>9.2f}s{d['total_s']:>8.2f}s"
              f"{call['call_s']:>15.2f}s{cold[n]:>11.2f}s{d['total_s'] / cold[n]:>13.2f}")
    print("\nsteps/s at each size: " + ", ".join(
        f"{n} rank(s) {r:.0f}" for n, r in zip(sizes, rates, strict=True)))
    one_two = [d["total_s"] for d in done if (d["from"], d["to"]) == (1, 2)]
    if one_two:
        t12 = median(one_two)
        print(f"1 -> 2: {t12:.2f} s, against KungFu's reported ~{KUNGFU_1_TO_2_S:.0f} s: "
              f"{KUNGFU_1_TO_2_S / t12:.1f}x lower (different machines and models: a shape, "
              f"not a race)")


if __name__ == "__main__":
    main()
