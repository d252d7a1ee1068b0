"""Synchronisation as a hyper-parameter: small batches with model averaging against
large-batch synchronous SGD, time to accuracy side by side (CROSSBOW's claim shape).

Runs in: a driver process; every run is a real 2-rank job (gloo/CPU) of adaptive_train.py
(the teacher-student task of the adaptive-batch benchmark: same model, data, seeds, lr and
momentum), one after another, the order reversed each round. ``ssgd B``: DDP's gradient
all-reduce every step at global batch B; ``model averaging B/p``: each rank steps on its
own B/2 samples and the two models are averaged every p steps (``sync=model_averaging``,
``averaging_period=p``). Time is the job's own training time (evaluations excluded) at the
first evaluation at or above the target. It prints the table and, for each model-averaging
run, the ratio of the best large-batch ssgd time to its own.

CROSSBOW reports small batches with model averaging 1.3-4x faster to accuracy than large-
batch synchronous SGD on 8 GPUs; here two CPU ranks on two cores, whose all-reduce is cheap
next to a GPU cluster's, show the shape on the smallest scale.

Usage: .venv/bin/python benchmarks/sync.py [--target-acc 0.75] [--rounds 1]
       [--ssgd 256,512,1024] [--averaging 64/4,64/16]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _common import machine_facts, median, private_home
from adaptive_batch import median_time, run_rounds, write_svg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-acc", type=float, default=0.75)
    ap.add_argument("--ssgd", default="256,512,1024", help="global batches with ssgd")
    ap.add_argument("--averaging", default="64/4,64/16",
                    help="global batch/averaging period pairs with model averaging")
    ap.add_argument("--samples", type=int, default=262144)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--plot", type=Path, default=Path("benchmarks/out/sync.svg"))
    a = ap.parse_args()
    home = private_home()
    print(machine_facts())
    print(f"sync: 2 ranks, gloo/CPU, teacher-student classification ({a.samples:,} fresh "
          f"samples, one pass), lr 0.05, momentum 0.9; target accuracy {a.target_acc}\n",
          flush=True)
    common = ["--samples", str(a.samples)]
    runs = [(f"ssgd {b}", ["--batch", str(b), *common]) for b in a.ssgd.split(",")]
    for pair in a.averaging.split(","):
        b, period = pair.split("/")
        runs.append((f"averaging {b}/{period}", ["--batch", b, "--sync", "model_averaging",
                                                 "--period", period, *common]))
    results = run_rounds(runs, a.rounds, a.target_acc, home)

    def med_time(label: str) -> float | None:
        return median_time(results, label, a.target_acc)

    print(f"\n{'run':<20}{'time to ' + str(a.target_acc):>16}{'final acc':>11}"
          f"{'training s':>12}   (medians over rounds)")
    for label, _ in runs:
        t = med_time(label)
        print(f"{label:<20}{(f'{t:.1f} s' if t is not None else 'not reached'):>16}"
              f"{median([x['final'] for x in results[label]]):>11.4f}"
              f"{median([x['seconds'] for x in results[label]]):>12.1f}")
    ssgd = {label: t for label, _ in runs if label.startswith("ssgd")
            and (t := med_time(label)) is not None}
    print()
    if not ssgd:
        print("no ssgd run reached the target: lower --target-acc")
    else:
        best = min(ssgd, key=lambda k: ssgd[k])
        for label, _ in runs:
            if label.startswith("averaging"):
                t = med_time(label)
                print(f"{label}: " + (f"{ssgd[best] / t:.2f}x the speed of the best "
                                      f"large-batch ssgd ({best}, {ssgd[best]:.1f} s)"
                                      if t is not None else "did not reach the target"))
    write_svg(a.plot, a.target_acc, [(label, results[label][0]["curve"]) for label, _ in runs])
    print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()
