"""The fault table: every failure scenario on a real 2-rank job, one row each: how long
until it was told, whom it blamed, whether the job restarted, the steps lost and the log
records lost (which must be 0).

Runs in: a driver process (a client of the jobs; it never imports torch). The job is the
tests' toy DDP job (tests/jobs/toy.py), 2 ranks on gloo. Faults come from outside (a
signal to one rank's process, found by its environment) or from the script at a chosen
step (an exception, an exit code, a hang in the script's own code).

Columns: ``told s`` is from the fault to the job's terminal state (or, with restarts, to
the restart event); for a hang, from the last step the job logged. ``blamed`` is
``job.error`` (or the restart event's cause). A row fails when the rank or the kind blamed
is not the one the fault hit, when a job that should restart did not, or when any log
record is missing or repeated; the script then exits non-zero.

Usage: .venv/bin/python benchmarks/faults.py [--only kill-rank1,hang]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import job_env, machine_facts, private_home

import hpinteract as hpi
from hpinteract.client.history import read_records

TOY = Path(__file__).resolve().parents[1] / "tests" / "jobs" / "toy.py"
HANG_TIMEOUT = 3.0


@dataclass
class Scenario:
    name: str
    rank: int  # the rank the fault hits
    kind: str  # what the blame must say (protocol/failures.py's kinds)
    args: list[str] = field(default_factory=list)
    signal: int | None = None  # sent from outside once the job trains
    restarts: int = 0


SCENARIOS = [
    Scenario("kill -9 rank 1", 1, "signal", signal=signal.SIGKILL),
    Scenario("kill -9 rank 0", 0, "signal", signal=signal.SIGKILL),
    Scenario("kill -TERM rank 1", 1, "stopped", signal=signal.SIGTERM),
    Scenario("rank 1 raises", 1, "exception", ["--crash-rank", "1", "--crash-step", "30"]),
    Scenario("rank 1 exits 3", 1, "exit", ["--crash-rank", "1", "--crash-step", "30",
                                           "--exit", "3"]),
    Scenario("rank 0 exits 3", 0, "exit", ["--crash-rank", "0", "--crash-step", "30",
                                           "--exit", "3"]),
    Scenario("rank 1 hangs", 1, "hang", ["--crash-rank", "1", "--crash-step", "30",
                                         "--hang", "inf"]),
    Scenario("kill -9 rank 1, restarts", 1, "signal", signal=signal.SIGKILL, restarts=1),
    Scenario("rank 1 hangs, restarts", 1, "hang", ["--crash-rank", "1", "--crash-step", "30",
                                                   "--hang", "inf"], restarts=1),
]


def rank_pid(run_dir: Path, rank: int) -> int:
    want = {f"HPINTERACT_RUN_DIR={run_dir}".encode(), f"RANK={rank}".encode(),
            f"LOCAL_RANK={rank}".encode()}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                env = set((p / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if want <= env:
                return int(p.name)
    raise RuntimeError(f"no process of rank {rank} under {run_dir}")


def wait_step(job: hpi.Job, step: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (job.status().get("latest") or {}).get("step", -1) >= step:
            return
        time.sleep(0.02)
    raise RuntimeError(f"job {job.id} did not reach step {step}")


def records_lost(job: hpi.Job, total: int | None) -> int:
    """Steps missing from (or repeated in) the metrics log: 0..last once each, and with a
    known length (a job that finished) all of them."""
    steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    want = range(total if total is not None else (max(steps) + 1 if steps else 0))
    return len(set(want) - set(steps)) + (len(steps) - len(set(steps)))


def run(s: Scenario, home: Path) -> dict[str, Any]:
    epochs = ["--n", "1024", "--epochs", "1"]  # 64 steps: a restarted job finishes
    job = hpi.launch(TOY, nproc=2, home=home, env=job_env(), max_restarts=s.restarts,
                     hparams={"sleep": 0.01, "hang_timeout": HANG_TIMEOUT,
                              "checkpoint_every": 10},
                     args=[*s.args, *epochs])
    t0 = None
    if s.signal is not None:
        wait_step(job, 30)
        t0 = time.time()
        os.kill(rank_pid(job.run_dir.path, s.rank), s.signal)
    state = job.wait(180)
    ev = job.events()
    restarts = ev[ev.kind == "restart"].to_dict("records") if "kind" in ev else []
    if restarts:
        r = restarts[0]
        blamed, rank, kind = str(r["error"]), r["failed_rank"], r["failed_kind"]
        told_at, lost = float(r["time"]), int(r["steps_lost"])
    else:
        err = job.error
        blamed = str(err) if err is not None else "-"
        rank, kind = (err.rank, err.kind) if err is not None else (None, None)
        ended = ev[(ev.kind == "state") & (ev.state == state.value)]
        told_at, lost = float(ended.time.iloc[-1]), 0
    if t0 is None:  # the fault came from the script: from the last step before it
        before = [m for m in read_records(job.run_dir.metrics_log) if not m.get("eval")
                  and m["step"] < 30]
        t0 = float(before[-1]["time"]) if before else told_at
    total = 64 if state == hpi.JobState.FINISHED else None
    row = {"scenario": s.name, "told_s": told_at - t0, "blamed": blamed, "rank": rank,
           "kind": kind, "restarted": bool(restarts), "state": state.value,
           "steps_lost": lost, "records_lost": records_lost(job, total)}
    row["ok"] = (rank == s.rank and kind == s.kind and row["records_lost"] == 0
                 and row["restarted"] == bool(s.restarts)
                 and state == (hpi.JobState.FINISHED if s.restarts else hpi.JobState.FAILED))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    chosen = [s for s in SCENARIOS if not a.only or s.name in a.only.split(",")]
    home = private_home(a.keep)
    print(machine_facts())
    print(f"faults: the toy job, 2 ranks on gloo/CPU, hang_timeout={HANG_TIMEOUT:g}s, "
          "checkpoint_every=10\n", flush=True)
    rows = []
    for s in chosen:
        rows.append(run(s, home))
        r = rows[-1]
        print(f"{r['scenario']:<26} told {r['told_s']:6.2f}s  restarted {r['restarted']!s:<5} "
              f"steps lost {r['steps_lost']:<3} records lost {r['records_lost']:<2} "
              f"{'ok' if r['ok'] else 'WRONG'}\n    blamed: {r['blamed'][:160]}", flush=True)
    print("\n| scenario | told (s) | blamed | restarted | steps lost | records lost |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        blamed = r["blamed"].split(";")[0]
        print(f"| {r['scenario']} | {r['told_s']:.2f} | {blamed[:90]} | "
              f"{'yes' if r['restarted'] else 'no'} | {r['steps_lost']} | "
              f"{r['records_lost']} |")
    wrong = [r["scenario"] for r in rows if not r["ok"]]
    if wrong:
        sys.exit(f"faults: wrong blame, restart or lost records in: {', '.join(wrong)}")


if __name__ == "__main__":
    main()
