"""Latency of a live change: from ``job.set()`` to its acknowledgement, in ms and in steps.

Runs in: a driver process on the machine under test. It launches the benchmarks' DDP job
(train.py --mode hpi, 2 ranks on gloo/CPU), subscribes to its live stream in a thread (as a
dashboard would) and, once the job is past its warm-up, makes ``--changes`` changes of lr
(alternating two values, a random pause of up to ``--gap-ms`` before each, so that calls
fall at every phase of the sync interval). For each change it records:

- the wall time from the call to ``job.set()`` to the acknowledgement coming back;
- ``ack.applied_at_step`` against the step current at the call: the step being trained,
  i.e. one past the last step finished. "Current" is read two ways: from the live stream
  (the latest metric the client had seen) and, after the run, from the job's metrics log
  (the last step whose end time precedes the call). 1 step = the very next step;
- afterwards, that every rank applied it at ``applied_at_step`` (``job.applied_steps``) and
  that the lr the metrics log shows changes exactly at that step.

Usage: .venv/bin/python benchmarks/latency.py [--changes 200] [--nproc 2]
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import sys
import time
from typing import Any

from _common import OUT, TRAIN, StreamWatcher, job_env, machine_facts, median, pct, private_home

import hpinteract as hpi

LRS = (0.04, 0.05)  # train.py starts at 0.05


def row(name: str, values: list[float], unit: str, fmt: str = ".1f") -> str:
    qs = [pct(values, q) for q in (50, 90, 99)] + [max(values, default=float("nan"))]
    return f"{name:<44}" + "".join(f"{q:>9{fmt}}" for q in qs) + f"  {unit}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=300, help="steps before the first change")
    ap.add_argument("--gap-ms", type=float, default=100.0,
                    help="max random pause before a set (>= the sync interval: any phase)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sync-every", type=int, default=None,
                    help="control sync every N steps (default: the job's automatic spacing)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds for the whole run")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    a = ap.parse_args()
    home = private_home(a.keep)
    OUT.mkdir(exist_ok=True)
    out = OUT / "latency-job.json"
    out.unlink(missing_ok=True)
    print(machine_facts())
    print(f"latency: {a.nproc} ranks, gloo/CPU, {a.changes} changes of lr after {a.warmup} "
          f"steps, pause before each uniform in [0, {a.gap_ms:g}] ms "
          f"(HPINTERACT_HOME={home})\n", flush=True)
    deadline = time.monotonic() + a.timeout
    sync = ["--sync-every", str(a.sync_every)] if a.sync_every else []
    job = hpi.launch(TRAIN, nproc=a.nproc, args=["--mode", "hpi", "--steps", "0", "--warmup",
                     str(a.warmup), "--out", str(out), *sync], env=job_env(), home=home)
    # The subscriber has a Job of its own, as a dashboard in another kernel would.
    watcher = StreamWatcher(hpi.attach(job.id, home=home))
    watcher.start()
    while watcher.latest_step < a.warmup:
        if job.state.terminal or time.monotonic() > deadline or not watcher.is_alive():
            sys.exit(f"job {job.id} did not reach step {a.warmup}: {job.state.value} "
                     f"{job.error or watcher.error or ''}\n{job.logs()[-3000:]}")
        time.sleep(0.05)
    job.set(lr=LRS[1])  # connects the control socket: not part of any measurement

    rng = random.Random(a.seed)
    calls: list[dict[str, Any]] = []
    for i in range(a.changes):
        if time.monotonic() > deadline:
            print(f"time is up after {i} changes", file=sys.stderr)
            break
        time.sleep(rng.uniform(0, a.gap_ms) / 1e3)
        lr = LRS[i % 2]
        seen, t_wall = watcher.latest_step, time.time()
        t0 = time.perf_counter()
        ack = job.set(lr=lr)
        ms = 1e3 * (time.perf_counter() - t0)
        calls.append({"id": ack.change_id, "lr": lr, "seen": seen, "t": t_wall, "ms": ms,
                      "applied": ack.applied_at_step})
    job.stop()
    state = job.wait(timeout=max(30.0, deadline - time.monotonic()))
    watcher.join(30)
    if state != hpi.JobState.FINISHED:
        print(f"warning: the job ended {state.value}: {job.error}", file=sys.stderr)
    report(a, job, watcher, calls, json.loads(out.read_text()) if out.exists() else {})


def report(a: argparse.Namespace, job: hpi.Job, watcher: StreamWatcher,
           calls: list[dict[str, Any]], timing: dict[str, Any]) -> None:
    m = job.metrics().sort_values("step")
    steps, ends = m["step"].astype(int).tolist(), m["time"].astype(float).tolist()
    lr_at = dict(zip(steps, m["lr"].astype(float).tolist(), strict=True))
    true_steps, stream_steps, bad_ranks, bad_lr = [], [], [], []
    for c in calls:
        k = bisect.bisect_right(ends, c["t"])  # steps[:k] had ended when set() was called
        current = steps[k - 1] + 1 if k else 0
        true_steps.append(c["applied"] - current)
        stream_steps.append(c["applied"] - (c["seen"] + 1))
        ranks = job.applied_steps(c["id"])
        if ranks != {r: c["applied"] for r in range(a.nproc)}:
            bad_ranks.append((c["id"], c["applied"], ranks))
        before = lr_at.get(c["applied"] - 1)
        if lr_at.get(c["applied"]) != c["lr"] or before is None or before == c["lr"]:
            bad_lr.append((c["applied"], before, lr_at.get(c["applied"])))
    first, last = calls[0]["t"], calls[-1]["t"]
    window = m[(m["time"] >= first) & (m["time"] <= last)]
    step_ms = 1e3 * float(window["step_time"].median())
    ms = [c["ms"] for c in calls]
    print(f"step time while changing: {step_ms:.2f} ms/step (median of the job's step_time); "
          f"whole run after warm-up: {timing.get('ms_per_step', float('nan')):.2f} ms/step, "
          f"a sync point every {timing['steps'] / timing['syncs']:.1f} steps"
          if timing.get("syncs") else "")
    print(f"\n{'':<44}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
    print(row("set() -> ack", ms, "ms"))
    print(row("set() -> ack, in step times", [x / step_ms for x in ms], "steps", ".2f"))
    print(row("applied_at_step - current step (job's log)", true_steps, "steps", ".0f"))
    print(row("applied_at_step - current step (stream)", stream_steps, "steps", ".0f"))
    print(row("stream delay, step end -> subscriber", watcher.lags_ms, "ms"))
    print(f"\n{len(calls)} changes, mean {sum(ms) / len(ms):.1f} ms; every rank applied each at "
          f"ack.applied_at_step: {'yes' if not bad_ranks else 'NO'} ({len(calls) - len(bad_ranks)}"
          f"/{len(calls)} checked with job.applied_steps); the logged lr changes exactly at "
          f"that step: {'yes' if not bad_lr else 'NO'} ({len(calls) - len(bad_lr)}/{len(calls)})")
    for bad in bad_ranks[:5]:
        print(f"  rank mismatch: change {bad[0]} acked at {bad[1]}, ranks applied at {bad[2]}")
    for bad in bad_lr[:5]:
        print(f"  lr mismatch at step {bad[0]}: before {bad[1]}, at it {bad[2]}")
    summary = {"args": vars(a), "step_ms": step_ms, "timing": timing, "calls": calls,
               "ack_ms": {q: pct(ms, q) for q in (50, 90, 99, 100)},
               "steps": {q: pct(true_steps, q) for q in (50, 90, 99, 100)},
               "stream_steps": {q: pct(stream_steps, q) for q in (50, 90, 99, 100)},
               "stream_lag_ms_p50": median(watcher.lags_ms),
               "bad_ranks": len(bad_ranks), "bad_lr": len(bad_lr)}
    (OUT / "latency.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
