"""Throughput overhead of hpinteract: plain torchrun DDP against the same loop instrumented.

Runs in: a driver process on the machine under test. Each round runs every variant once,
interleaved (plain, hpi, plain, hpi, ...), so that the load of a shared machine falls on
both alike; the verdict is the per-round ratio hpi/plain, never an absolute time.

Variants (all real torchrun jobs, 2 ranks on gloo/CPU, OMP_NUM_THREADS=1, same model,
data, batch, loop and seed; see train.py):

- ``plain``: ``torchrun --standalone --nproc-per-node N train.py --mode plain``.
- ``hpi``: ``hpi.launch(train.py --mode hpi)``: metrics published every step, and a client
  thread subscribed to the live stream (``hpi.attach(id).stream()``) the whole time.
- ``hpi-nostream`` (diagnostic, not run by default): the same job with nobody subscribed.

Usage: .venv/bin/python benchmarks/overhead.py [--steps 1500] [--rounds 3] [--nproc 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import OUT, TRAIN, StreamWatcher, job_env, machine_facts, median, pct, \
    private_home, torchrun

import hpinteract as hpi

GOAL = 0.98
VARIANTS = ("plain", "hpi", "hpi-nostream")


def run_plain(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [*torchrun(), "--standalone", "--nproc-per-node", str(a.nproc), str(TRAIN),
           "--mode", "plain", "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--out", str(out)]
    log = out.with_suffix(".log")
    with open(log, "wb") as f:
        rc = subprocess.run(cmd, env={**os.environ, **job_env()}, stdout=f,
                            stderr=subprocess.STDOUT, timeout=a.timeout, check=False).returncode
    if rc != 0:
        sys.exit(f"plain run failed (exit {rc}):\n{log.read_text()[-3000:]}")
    return json.loads(out.read_text())


def run_hpi(a: argparse.Namespace, out: Path, home: Path, stream: bool) -> dict[str, Any]:
    args = ["--mode", "hpi", "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--out", str(out)]
    job = hpi.launch(TRAIN, nproc=a.nproc, args=args, env=job_env(), home=home)
    watcher = StreamWatcher(hpi.attach(job.id, home=home)) if stream else None
    if watcher is not None:
        watcher.start()
    try:
        state = job.wait(timeout=a.timeout)
    except hpi.HpiTimeout:
        job.stop()
        raise
    if watcher is not None:
        watcher.join(30)
    if state != hpi.JobState.FINISHED:
        sys.exit(f"hpi run {job.id} ended {state.value}: {job.error}\n{job.logs()[-3000:]}")
    rec: dict[str, Any] = json.loads(out.read_text())
    if watcher is not None:
        if watcher.error is not None:
            sys.exit(f"the stream subscriber failed: {watcher.error!r}")
        rec.update(stream_metrics=watcher.metrics, stream_events=watcher.events,
                   lag_p50_ms=median(watcher.lags_ms), lag_p99_ms=pct(watcher.lags_ms, 99),
                   lag_max_ms=max(watcher.lags_ms, default=float("nan")))
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=200, help="untimed steps before them")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--variants", default="plain,hpi",
                    help=f"comma-separated, from {', '.join(VARIANTS)}; the first is the base")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    a = ap.parse_args()
    variants = a.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        ap.error(f"unknown variants: {', '.join(sorted(unknown))}")
    home = private_home(a.keep)
    OUT.mkdir(exist_ok=True)
    print(machine_facts())
    print(f"overhead: {a.nproc} ranks, gloo/CPU, {a.warmup} warm-up + {a.steps} timed steps, "
          f"{a.rounds} rounds of {' / '.join(variants)} (HPINTERACT_HOME={home})\n", flush=True)

    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(a.rounds):
        for v in variants:
            out = OUT / f"overhead-{v}-{r}.json"
            out.unlink(missing_ok=True)
            t = time.monotonic()
            rec = run_plain(a, out) if v == "plain" else \
                run_hpi(a, out, home, stream=(v == "hpi"))
            results[v].append(rec)
            extra = (f"  stream {rec['stream_metrics']} metrics, lag p50 "
                     f"{rec['lag_p50_ms']:.0f} ms" if "stream_metrics" in rec else "")
            print(f"round {r}  {v:<13} {rec['steps_per_s']:8.1f} steps/s  "
                  f"{rec['ms_per_step']:.3f} ms/step  (run took {time.monotonic() - t:.1f} s)"
                  f"{extra}", flush=True)

    base = variants[0]
    print(f"\n{'round':<6}" + "".join(f"{v + ' steps/s':>22}" for v in variants)
          + "".join(f"{v + '/' + base:>22}" for v in variants[1:]))
    ratios: dict[str, list[float]] = {v: [] for v in variants[1:]}
    for r in range(a.rounds):
        b = results[base][r]["steps_per_s"]
        row = f"{r:<6}" + "".join(f"{results[v][r]['steps_per_s']:>22.1f}" for v in variants)
        for v in variants[1:]:
            ratios[v].append(results[v][r]["steps_per_s"] / b)
            row += f"{ratios[v][-1]:>22.4f}"
        print(row)

    print(f"\n{'variant':<14}{'median steps/s':>16}{'ms/step':>10}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'max ms':>9}{'steps/sync':>12}")
    for v in variants:
        rs = results[v]
        syncs = median([x["syncs"] for x in rs]) if "syncs" in rs[0] else None
        per_sync = f"{a.steps / syncs:.1f}" if syncs else "-"
        print(f"{v:<14}{median([x['steps_per_s'] for x in rs]):>16.1f}"
              f"{median([x['ms_per_step'] for x in rs]):>10.3f}"
              f"{median([x['p50_ms'] for x in rs]):>9.3f}{median([x['p99_ms'] for x in rs]):>9.3f}"
              f"{median([x['max_ms'] for x in rs]):>9.2f}{per_sync:>12}")
    for v in variants:
        rs = [x for x in results[v] if "stream_metrics" in x]
        if rs:
            print(f"{v}: the subscriber got {min(x['stream_metrics'] for x in rs)}.."
                  f"{max(x['stream_metrics'] for x in rs)} metric records per run (steps run: "
                  f"{a.warmup + a.steps}); live delay step end -> client: p50 "
                  f"{median([x['lag_p50_ms'] for x in rs]):.1f} ms, p99 "
                  f"{median([x['lag_p99_ms'] for x in rs]):.1f} ms, max "
                  f"{max(x['lag_max_ms'] for x in rs):.1f} ms")

    summary: dict[str, Any] = {"args": vars(a), "results": results, "ratios": {}}
    print()
    for v, rs in ratios.items():
        med = median(rs)
        summary["ratios"][v] = {"median": med, "min": min(rs), "max": max(rs)}
        verdict = "meets" if med >= GOAL else "MISSES"
        print(f"throughput ratio {v}/{base}: median {med:.4f}  (min {min(rs):.4f}, max "
              f"{max(rs):.4f}, {len(rs)} rounds); {verdict} the goal >= {GOAL}")
    (OUT / "overhead.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
