"""`make demo`: launch the digits job on 2 ranks, change lr and then the batch size live
through the client, and show what happened: the step at which each change applied on every
rank, and the loss before and after it.

Runs in: a plain Python process (the client side); the job runs detached under torchrun.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hpinteract as hpi

HERE = Path(__file__).parent
WINDOW = 30  # steps averaged for "loss before / after"


def main() -> int:
    nproc = 2
    print(f"launching examples/digits/train.py on {nproc} ranks ...")
    job = hpi.launch(HERE / "digits" / "train.py", nproc=nproc, hparams={"lr": 0.003})
    print(f"job {job.id}   (run directory {job.run_dir.path})")
    plan = [(0.15, {"lr": 0.03}), (0.55, {"batch_size": 128})]
    changes = []
    last_print = 0.0
    for rec in job.stream():
        if rec.get("kind") == "change":
            print(f"  event: {rec['status']} {rec['values']} from {rec['source']}"
                  f" at step {rec.get('applied_at_step')}")
            continue
        if "step" not in rec or "kind" in rec:
            continue
        progress = rec.get("progress", 0.0)
        if time.monotonic() - last_print > 2.0:
            last_print = time.monotonic()
            print(f"  step {rec['step']:5d}  epoch {rec['epoch']:2d}  loss {rec['loss']:.4f}"
                  f"  lr {rec['lr']:.3g}  batch {rec['batch_size']}"
                  f"  {rec['samples_per_s']:8.0f} samples/s  {progress:4.0%}")
        if plan and progress >= plan[0][0]:
            _, values = plan.pop(0)
            print(f"-> job.set({', '.join(f'{k}={v}' for k, v in values.items())})"
                  f" at step {rec['step']}")
            changes.append((values, rec["step"], job.set(values, source="demo")))
    state = job.wait(120)
    print(f"job {state.value}")
    if state != hpi.JobState.FINISHED:
        print(job.error, file=sys.stderr)
        print(job.logs(), file=sys.stderr)
        return 1
    df = job.metrics().set_index("step")
    print()
    print(f"{'change':<22}{'asked at':>9}{'applied':>9}  {'per rank':<16}"
          f"{'loss before':>12}{'loss after':>11}")
    for values, asked, ack in changes:
        s = ack.applied_at_step
        ranks = job.applied_steps(ack.change_id)
        before = df.loc[max(0, s - WINDOW): s - 1, "loss"].mean()
        after = df.loc[s: s + WINDOW - 1, "loss"].mean()
        per_rank = ", ".join(f"r{r}:{st}" for r, st in sorted(ranks.items()))
        label = ", ".join(f"{k}={v}" for k, v in values.items())
        same = "same step on all" if len(set(ranks.values())) == 1 else "MISMATCH"
        print(f"{label:<22}{asked:>9}{s:>9}  {per_rank:<16}{before:>12.4f}{after:>11.4f}"
              f"   ({same})")
    print()
    print(f"{len(df)} steps logged; final loss {df['loss'].iloc[-WINDOW:].mean():.4f}")
    print(job.logs().strip().splitlines()[-1] if job.logs().strip() else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
