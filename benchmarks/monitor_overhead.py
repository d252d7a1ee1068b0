"""Throughput cost of the noise-scale monitor: the hpi job with ``monitor_gns=1`` against it off.

Runs in: a driver process on the machine under test. Every variant is the same job,
``hpi.launch(train.py --mode hpi, hparams={"monitor_gns": N})`` (2 ranks on gloo/CPU,
OMP_NUM_THREADS=1; see train.py), differing only in ``monitor_gns``: 0 (off, the base), 1
(the noise scale measured at every step) and 10 (every tenth step). Each round runs every
variant once, the order flipped each round; the verdict is the per-round ratio of
throughputs, never an absolute time.

Goal (the issue): with the noise-scale monitor on at every step, training throughput stays
within 2 % of the same run without it (KungFu reports 4.6 % for its noise-scale monitor).

Each run is checked after it ends: its metrics log (``hpi.attach(id).metrics()``) must hold
a finite ``gns`` at every step the monitor measures, and none when it is off. Each job also
reports its CPU time by thread over the timed window, which says where a difference goes.

Usage: .venv/bin/python benchmarks/monitor_overhead.py [--steps 1200] [--rounds 6]
       [--gns 0,1,10] [--batch 64] [--stream]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from _common import OUT, machine_facts, median, private_home, round_ratios
from overhead import TEARDOWN_FAILURES, cpu_groups, print_cpu_groups, run_hpi

import hpinteract as hpi
from hpinteract.trainer.monitors import GNSMonitor

GOAL = 0.98  # within 2 % of the run without the monitor
KUNGFU = 0.046  # KungFu's reported cost of its noise-scale monitor
REDUCE_EVERY = GNSMonitor.REDUCE_EVERY


def name(every: int) -> str:
    return f"gns={every}"


def check_monitor(job_id: str, home: Path, every: int, total_steps: int,
                  nproc: int) -> dict[str, Any]:
    """The job's metrics must show the monitor did what ``monitor_gns=every`` asks: a finite
    ``gns`` and ``grad_norm`` at every step that publishes them, none when off. Exits
    otherwise."""
    df = hpi.attach(job_id, home=home).metrics()
    cols = ("gns", "grad_norm", "gns_grad_sq", "gns_var")
    steps = df["step"].tolist() if "step" in df else []
    if len(steps) != total_steps:
        sys.exit(f"job {job_id}: its metrics log has {len(steps)} records, expected "
                 f"{total_steps} (one per step)")
    present = {c: [float(x) for x in df[c].tolist()] if c in df else [float("nan")] * len(steps)
               for c in cols}
    finite = [int(s) for s, g in zip(steps, present["gns"], strict=True) if math.isfinite(g)]
    if every == 0:
        if finite:
            sys.exit(f"job {job_id} (monitor_gns=0): {len(finite)} records carry a gns "
                     f"(first at step {finite[0]}): the monitor ran although off")
        return {"gns_records": 0, "gns_expected": 0, "gns_last": float("nan")}
    # With several ranks the estimate and grad_norm as of a step that issued the sum of the
    # ranks' shares (every REDUCE_EVERY steps at most) are published with the next measured
    # step; with one, grad_norm at every measured step.
    measured = [s for s in range(total_steps) if s % every == 0]
    expected, issued, inflight = [], None, False
    for s in measured:
        if inflight:
            expected.append(s)
        inflight = issued is None or s - issued >= REDUCE_EVERY
        issued = s if inflight else issued
    norms = {int(s) for s, g in zip(steps, present["grad_norm"], strict=True)
             if math.isfinite(g)}
    with_norm = expected if nproc > 1 else measured
    missing = sorted(set(expected) - set(finite)) + sorted(set(with_norm) - norms)
    if not finite or missing:
        sys.exit(f"job {job_id} (monitor_gns={every}): finite gns at {len(finite)} of the "
                 f"{len(expected)} publishing steps, grad_norm at {len(norms)} of "
                 f"{len(with_norm)} (missing e.g. {missing[:5]}): the "
                 "noise-scale monitor did not run as asked")
    last = finite[-1]
    i = steps.index(last)
    return {"gns_records": len(finite), "gns_expected": len(expected),
            "gns_last": present["gns"][i], "grad_norm_last": present["grad_norm"][i]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1200, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=200, help="untimed steps before them")
    ap.add_argument("--rounds", type=int, default=6, help="an even number balances the order")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64,
                    help="global batch (train.py's default: 64, the smallest steps, where "
                         "the monitor's fixed per-step cost weighs most)")
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                    help="train.py's model: mlp (the least compute per weight, where the "
                         "monitor's per-weight cost weighs most) or cnn")
    ap.add_argument("--gns", default="0,1,10",
                    help="comma-separated monitor_gns values, one variant each; the first "
                         "is the base (0: off)")
    ap.add_argument("--stream", action="store_true",
                    help="subscribe a client thread to each job's live stream, as overhead.py's "
                         "hpi variant does (more load on a small machine, more noise)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    a = ap.parse_args()
    try:
        everies = [int(x) for x in a.gns.split(",")]
    except ValueError:
        ap.error(f"--gns takes integers, got {a.gns!r}")
    if len(set(everies)) != len(everies) or len(everies) < 2 or min(everies) < 0:
        ap.error("--gns needs at least two distinct values >= 0")
    if a.steps < 1:
        ap.error("--steps must be at least 1 (a run ends by itself here)")
    variants = [name(e) for e in everies]
    home = private_home(a.keep)
    OUT.mkdir(exist_ok=True)
    print(machine_facts())
    print(f"monitor overhead: {a.model}, {a.nproc} ranks, gloo/CPU, global batch {a.batch}, "
          f"{a.warmup} "
          f"warm-up + {a.steps} timed steps, {a.rounds} rounds of {' / '.join(variants)} "
          "(hpi job, monitor_gns via "
          f"hpi.launch hparams; live subscriber: {'yes' if a.stream else 'no'}; "
          f"HPINTERACT_HOME={home})\n", flush=True)

    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(a.rounds):
        order = list(zip(everies, variants, strict=True))
        for every, v in order if r % 2 == 0 else order[::-1]:
            out = OUT / f"monitor-{v.replace('=', '')}-{r}.json"
            out.unlink(missing_ok=True)
            t = time.monotonic()
            rec = run_hpi(a, out, home, stream=a.stream, hparams={"monitor_gns": every},
                          extra=("--batch", str(a.batch), "--model", a.model))
            took = time.monotonic() - t
            rec.update(check_monitor(rec["job_id"], home, every, a.warmup + a.steps,
                                     a.nproc))
            results[v].append(rec)
            gns = (f"  gns at {rec['gns_records']} steps, last {rec['gns_last']:.4g}"
                   if every else "  no gns (off)")
            print(f"round {r}  {v:<8} {rec['steps_per_s']:8.1f} steps/s  "
                  f"{rec['ms_per_step']:.3f} ms/step  {rec['cpu_ms_per_step']:.3f} CPU ms/step"
                  f"  (run took {took:.1f} s){gns}", flush=True)

    report(a, variants, results)


def report(a: argparse.Namespace, variants: list[str],
           results: dict[str, list[dict[str, Any]]]) -> None:
    base, others = variants[0], variants[1:]

    def per_round(v: str, key: str, invert: bool = False) -> list[float]:
        return round_ratios(results, base, v, key, invert)

    def med(v: str, key: str) -> float:
        return median([x[key] for x in results[v]]) if key in results[v][0] else float("nan")

    tput = {v: per_round(v, "steps_per_s") for v in others}
    print(f"\n{'round':<6}" + "".join(f"{v + ' steps/s':>17}" for v in variants)
          + "".join(f"{v + '/' + base:>17}" for v in others))
    for r in range(a.rounds):
        print(f"{r:<6}" + "".join(f"{results[v][r]['steps_per_s']:>17.1f}" for v in variants)
              + "".join(f"{tput[v][r]:>17.4f}" for v in others))
    print(f"{'median':<6}" + "".join(f"{med(v, 'steps_per_s'):>17.1f}" for v in variants)
          + "".join(f"{median(tput[v]):>17.4f}" for v in others))

    print(f"\n{'variant':<9}{'steps/s':>9}{'ms/step':>9}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}"
          f"{'CPU ms/step':>13}{'gns records':>13}   (medians over rounds)")
    for v in variants:
        recs = f"{results[v][0]['gns_records']}/{results[v][0]['gns_expected']}"
        print(f"{v:<9}{med(v, 'steps_per_s'):>9.1f}{med(v, 'ms_per_step'):>9.3f}"
              f"{med(v, 'p50_ms'):>8.3f}{med(v, 'p99_ms'):>8.3f}{med(v, 'max_ms'):>8.2f}"
              f"{med(v, 'cpu_ms_per_step'):>13.3f}{recs:>13}")
    print("CPU ms/step: CPU time of all ranks (every thread) per step; base/variant of it is "
          "the throughput ratio\na machine with no other load would show while the ranks keep "
          "every core busy. gns records: steps\nwith a finite gns in the job's metrics log / "
          "steps the monitor measures (checked every run).")

    print_cpu_groups(variants, results)
    base_cpu = med(base, "cpu_ms_per_step")
    for v in others:
        pairs = list(zip(results[v], results[base], strict=True))
        groups = sorted({g for x, b in pairs for g in {**cpu_groups(x), **cpu_groups(b)}})
        delta = {g: median([cpu_groups(x).get(g, 0.0) - cpu_groups(b).get(g, 0.0)
                            for x, b in pairs]) for g in groups}
        total = median([x["cpu_ms_per_step"] - b["cpu_ms_per_step"] for x, b in pairs])
        split = ", ".join(f"{g} {d:+.3f}" for g, d in sorted(delta.items(), key=lambda kv:
                                                             -abs(kv[1])) if abs(d) >= 0.0005)
        print(f"{v} - {base}: {total:+.3f} CPU ms/step (median of per-round differences) = "
              f"{100 * total / base_cpu:+.1f} % of {base}'s {base_cpu:.2f}; by thread: {split}")
    print()

    summary: dict[str, Any] = {"args": vars(a), "results": results, "ratios": {},
                               "goal": GOAL}
    for v in others:
        t = tput[v]
        p50 = median(per_round(v, "p50_ms", invert=True))
        cpu = median(per_round(v, "cpu_ms_per_step", invert=True))
        summary["ratios"][v] = {"median": median(t), "min": min(t), "max": max(t),
                                "per_round": t, "p50_step": p50, "cpu": cpu}
        print(f"throughput ratio {v}/{base}: median {median(t):.4f} (min {min(t):.4f}, max "
              f"{max(t):.4f}, {len(t)} rounds): cost {100 * (1 - median(t)):.1f} %\n"
              f"    typical-step ratio (p50 {base}/{v}) {p50:.4f}; CPU-cost ratio {cpu:.4f}")
    head = name(1) if name(1) in others else others[0]
    ratio = median(tput[head])
    print(f"\ngoal: with the noise-scale monitor on at every step, training throughput stays "
          f"within 2 % of the same run\nwithout it (KungFu reports {100 * KUNGFU:.1f} % for its "
          f"noise-scale monitor): {head}/{base} median {ratio:.4f} "
          f"({100 * (1 - ratio):+.1f} % cost) {'meets' if ratio >= GOAL else 'MISSES'} "
          f"the goal >= {GOAL}")
    if head != name(1):
        print(f"    (no {name(1)} variant in this run: the verdict is {head}'s)")
    if TEARDOWN_FAILURES:
        print(f"\n{len(TEARDOWN_FAILURES)} run(s) failed at teardown, after training "
              f"(timings kept): {'; '.join(TEARDOWN_FAILURES)}")
    summary["teardown_failures"] = TEARDOWN_FAILURES
    (OUT / "monitor_overhead.json").write_text(json.dumps(summary, indent=1))
    if ratio < GOAL:
        sys.exit(f"monitor_overhead: {head}/{base} {ratio:.4f} misses the goal >= {GOAL}")


if __name__ == "__main__":
    main()
