"""Throughput overhead of hpinteract: plain torchrun DDP against the same loop instrumented.

Runs in: a driver process on the machine under test. Each round runs every variant once,
interleaved (plain, hpi | hpi, plain | plain, hpi ...: the order flips each round), so that
the load of a shared machine falls on both alike; the verdict is the per-round ratio
hpi/plain, never an absolute time. Each job also reports its CPU time by thread over the
timed window, which says where the difference goes.

Variants (all real torchrun jobs, 2 ranks on gloo/CPU, OMP_NUM_THREADS=1, same model,
data, batch, loop and seed; see train.py):

- ``plain``: ``torchrun --standalone --nproc-per-node N train.py --mode plain``.
- ``hpi``: ``hpi.launch(train.py --mode hpi)``: metrics published every step, and a client
  thread subscribed to the live stream (``hpi.attach(id).stream()``) the whole time.
- diagnostics, not run by default: ``hpi-sync1``, hpi with a control sync at every step
  (``hpi.init(sync_every=1)``); ``hpi-nostream``, the hpi job with nobody subscribed;
  ``plain-launch``, the plain script started by ``hpi.launch`` (supervisor, torchrun's log
  redirection, bootstrap) without ``hpi.init``: it separates launcher from library costs;
  ``hpi-thread`` and ``hpi-process``, hpi with the coordinator a thread of rank 0 (the
  default) or a process of its own (HPINTERACT_COORDINATOR=process); ``hpi-nice0``, that
  process at the ranks' own
  CPU priority (HPINTERACT_COORDINATOR_NICE=0) instead of 10 below.

Usage: .venv/bin/python benchmarks/overhead.py [--steps 1500] [--rounds 4] [--nproc 2]
       [--variants plain,hpi,hpi-nostream,plain-launch,hpi-sync1]
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

from _common import (
    OUT,
    TRAIN,
    StreamWatcher,
    job_env,
    machine_facts,
    median,
    pct,
    private_home,
    round_ratios,
    torchrun,
)

import hpinteract as hpi

GOAL = 0.98
VARIANTS = ("plain", "hpi", "hpi-nostream", "plain-launch", "hpi-sync1", "hpi-thread",
            "hpi-nice0", "hpi-process")
TEARDOWN_FAILURES: list[str] = []


def run_plain(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [*torchrun(), "--standalone", "--nproc-per-node", str(a.nproc), str(TRAIN),
           "--mode", "plain", "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--out", str(out)]
    log = out.with_suffix(".log")
    with open(log, "wb") as f:
        rc = subprocess.run(cmd, env={**os.environ, **job_env()}, stdout=f,
                            stderr=subprocess.STDOUT, timeout=a.timeout, check=False).returncode
    if rc != 0:
        ended(f"plain run (torchrun exit {rc}, see {log})", out, log.read_text())
    return json.loads(out.read_text())


def ended(what: str, out: Path, logs: str) -> None:
    """A run that failed. One that failed only after rank 0 wrote its timing is counted
    and kept: a rank that aborts at exit (torch 2.13, gloo; see README) is no measurement
    error. Anything else ends the benchmark."""
    if not out.exists():
        sys.exit(f"{what} failed before its timing was written:\n{logs[-3000:]}")
    TEARDOWN_FAILURES.append(what)
    print(f"  warning: {what} failed after training (teardown); its timing is kept "
          "(--keep keeps run directories and logs)", flush=True)


def run_hpi(a: argparse.Namespace, out: Path, home: Path, stream: bool, mode: str = "hpi",
            extra: tuple[str, ...] = (), hparams: dict[str, Any] | None = None,
            coordinator: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``hpi.launch`` run of train.py; ``hparams`` go to launch as overrides. The
    record is rank 0's timing plus the job's id (``job_id``) and, with ``stream``, the
    subscriber's figures."""
    args = ["--mode", mode, "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--out", str(out), *extra]
    job = hpi.launch(TRAIN, nproc=a.nproc, hparams=hparams, args=args, home=home,
                     env={**job_env(), **(coordinator or {})})
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
        ended(f"{mode} job {job.id} ({state.value}: {job.error})", out, job.logs())
    rec: dict[str, Any] = {**json.loads(out.read_text()), "job_id": job.id}
    if watcher is not None:
        if watcher.error is not None:
            sys.exit(f"the stream subscriber failed: {watcher.error!r}")
        rec.update(stream_metrics=watcher.metrics, stream_events=watcher.events,
                   lag_p50_ms=median(watcher.lags_ms), lag_p99_ms=pct(watcher.lags_ms, 99),
                   lag_max_ms=max(watcher.lags_ms, default=float("nan")),
                   client_cpu_ms_per_step=1e3 * watcher.cpu_s / max(1, watcher.metrics))
        rec["cpu_ms_per_step"] += rec["client_cpu_ms_per_step"]
    return rec


def cpu_groups(rec: dict[str, Any]) -> dict[str, float]:
    """A run's CPU ms per step by kind of thread, summed over ranks (+ the subscriber)."""
    out = {"client": rec.get("client_cpu_ms_per_step", 0.0)}
    for threads in rec.get("rank_threads_ms_per_step", []):
        for name, ms in threads.items():
            g = name if name in ("training thread", "hpi-coordinator") else \
                "hpi-link" if name.startswith("hpi-link") else \
                "gloo" if "gloo" in name else "zmq I/O" if name.startswith("ZMQ") else "other"
            out[g] = out.get(g, 0.0) + ms
    return out


# hpi-coordinator: the thread, or the process of its own (its zmq I/O thread included);
# hpi-link: rank 0's two threads that talk to that process.
CPU_GROUPS = ("training thread", "hpi-coordinator", "hpi-link", "gloo", "zmq I/O", "other",
              "client")


def print_cpu_groups(variants: list[str], results: dict[str, list[dict[str, Any]]]) -> None:
    """The table of CPU ms per step by kind of thread (cpu_groups), medians over rounds."""
    print(f"\nCPU ms per step by thread, all ranks together (medians over rounds):\n"
          f"{'variant':<14}" + "".join(f"{g:>17}" for g in CPU_GROUPS))
    for v in variants:
        by = [cpu_groups(x) for x in results[v]]
        print(f"{v:<14}" + "".join(f"{median([b.get(g, 0.0) for b in by]):>17.3f}"
                                   for g in CPU_GROUPS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=200, help="untimed steps before them")
    ap.add_argument("--rounds", type=int, default=4, help="an even number balances the order")
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
        # A B, B A, A B, ...: drift of the machine's load and any first/last-in-round effect
        # fall on every variant alike.
        for v in variants if r % 2 == 0 else variants[::-1]:
            out = OUT / f"overhead-{v}-{r}.json"
            out.unlink(missing_ok=True)
            t = time.monotonic()
            if v == "plain":
                rec = run_plain(a, out)
            elif v == "plain-launch":
                rec = run_hpi(a, out, home, stream=False, mode="plain")
            elif v == "hpi-sync1":  # a control sync at every step: the latency-first setting
                rec = run_hpi(a, out, home, stream=True, extra=("--sync-every", "1"))
            elif v == "hpi-thread":  # the coordinator as a thread of rank 0
                rec = run_hpi(a, out, home, stream=True,
                              coordinator={"HPINTERACT_COORDINATOR": "thread"})
            elif v == "hpi-nice0":  # the coordinator process at the ranks' own priority
                rec = run_hpi(a, out, home, stream=True,
                              coordinator={"HPINTERACT_COORDINATOR": "process",
                                           "HPINTERACT_COORDINATOR_NICE": "0"})
            elif v == "hpi-process":  # the coordinator in a process of its own
                rec = run_hpi(a, out, home, stream=True,
                              coordinator={"HPINTERACT_COORDINATOR": "process"})
            else:
                rec = run_hpi(a, out, home, stream=(v == "hpi"))
            results[v].append(rec)
            extra = (f"  stream {rec['stream_metrics']} metrics, lag p50 "
                     f"{rec['lag_p50_ms']:.0f} ms" if "stream_metrics" in rec else "")
            print(f"round {r}  {v:<13} {rec['steps_per_s']:8.1f} steps/s  "
                  f"{rec['ms_per_step']:.3f} ms/step  (run took {time.monotonic() - t:.1f} s)"
                  f"{extra}", flush=True)

    report(a, variants, results)


def report(a: argparse.Namespace, variants: list[str],
           results: dict[str, list[dict[str, Any]]]) -> None:
    base, others = variants[0], variants[1:]

    def per_round(v: str, key: str, invert: bool = False) -> list[float]:
        return round_ratios(results, base, v, key, invert)

    print(f"\n{'round':<6}" + "".join(f"{v + ' steps/s':>22}" for v in variants)
          + "".join(f"{v + '/' + base:>22}" for v in others))
    tput = {v: per_round(v, "steps_per_s") for v in others}
    for r in range(a.rounds):
        print(f"{r:<6}" + "".join(f"{results[v][r]['steps_per_s']:>22.1f}" for v in variants)
              + "".join(f"{tput[v][r]:>22.4f}" for v in others))

    print(f"\n{'variant':<14}{'steps/s':>9}{'ms/step':>9}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'max ms':>8}{'CPU ms/step':>13}{'client CPU':>12}{'steps/sync':>12}"
          "   (medians over rounds)")
    for v in variants:
        rs = results[v]

        def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
            return median([x[key] for x in rs]) if key in rs[0] else float("nan")

        syncs = med("syncs")
        print(f"{v:<14}{med('steps_per_s'):>9.1f}{med('ms_per_step'):>9.3f}{med('p50_ms'):>8.3f}"
              f"{med('p99_ms'):>8.3f}{med('max_ms'):>8.2f}{med('cpu_ms_per_step'):>13.3f}"
              f"{med('client_cpu_ms_per_step'):>12.3f}"
              f"{(f'{a.steps / syncs:.1f}' if syncs == syncs else '-'):>12}")
    for v in variants:
        rs = [x for x in results[v] if "stream_metrics" in x]
        if rs:
            print(f"{v}: the subscriber got {min(x['stream_metrics'] for x in rs)}.."
                  f"{max(x['stream_metrics'] for x in rs)} metric records per run (steps run: "
                  f"{a.warmup + a.steps}); live delay step end -> client: p50 "
                  f"{median([x['lag_p50_ms'] for x in rs]):.1f} ms, p99 "
                  f"{median([x['lag_p99_ms'] for x in rs]):.1f} ms, max "
                  f"{max(x['lag_max_ms'] for x in rs):.1f} ms")
    print("CPU ms/step: CPU time of all ranks (every thread, the coordinator's too) plus the "
          "subscriber thread's, per step;\nbase/variant of it is the throughput ratio a "
          "machine with no other load would show while the ranks keep every core busy.")

    print_cpu_groups(variants, results)
    base_cpu = median([x["cpu_ms_per_step"] for x in results[base]])
    for v in others:
        by = [cpu_groups(x) for x in results[v]]
        own = median([sum(b.get(g, 0.0) for g in ("hpi-coordinator", "zmq I/O", "client"))
                      for b in by])
        if own > 0:
            print(f"{v}: hpinteract's own threads (coordinator, ZeroMQ I/O, subscriber) use "
                  f"{own:.3f} CPU ms/step = {100 * own / base_cpu:.1f} % of {base}'s "
                  f"{base_cpu:.2f}; with every core busy that alone caps the ratio near "
                  f"{base_cpu / (base_cpu + own):.3f} (lower when the time is taken from one "
                  f"rank: the others wait for it at the next all-reduce)")
    print()

    summary: dict[str, Any] = {"args": vars(a), "results": results, "ratios": {}}
    for v in others:
        t = tput[v]
        p50 = median(per_round(v, "p50_ms", invert=True))
        cpu = median(per_round(v, "cpu_ms_per_step", invert=True))
        summary["ratios"][v] = {"median": median(t), "min": min(t), "max": max(t),
                                "p50_step": p50, "cpu": cpu}
        verdict = "meets" if median(t) >= GOAL else "MISSES"
        print(f"throughput ratio {v}/{base}: median {median(t):.4f} (min {min(t):.4f}, max "
              f"{max(t):.4f}, {len(t)} rounds): {verdict} the goal >= {GOAL}\n"
              f"    typical-step ratio (p50 {base}/{v}) {p50:.4f}; CPU-cost ratio {cpu:.4f}")
    if TEARDOWN_FAILURES:
        print(f"\n{len(TEARDOWN_FAILURES)} run(s) failed at teardown, after training "
              f"(timings kept): {'; '.join(TEARDOWN_FAILURES)}")
    summary["teardown_failures"] = TEARDOWN_FAILURES
    (OUT / "overhead.json").write_text(json.dumps(summary, indent=1))
    missed = [v for v in others if summary["ratios"][v]["median"] < GOAL]
    if missed:
        sys.exit(f"overhead: {', '.join(missed)} below the goal {base} x {GOAL}")


if __name__ == "__main__":
    main()
