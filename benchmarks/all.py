"""Every benchmark, one after another, and one table of what each says against its goal.

Runs in: a driver process; each benchmark is its own process with its default settings
(machine facts, rounds and all), its output kept in ``benchmarks/out/<name>.log``. A
benchmark exits non-zero when it misses the goal it prints, or when it could not measure;
this script then exits non-zero too, after running the rest. ``make bench`` calls it.

Usage: .venv/bin/python benchmarks/all.py [--only overhead,faults] [--skip load]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from _common import OUT, machine_facts

HERE = Path(__file__).resolve().parent

# name: the goal it checks (benchmarks/README.md says more), or what it measures.
GOALS = {
    "overhead": "hpi/plain throughput >= 0.98 (raw loop, 2 ranks)",
    "latency": "measured: set() to ack, ms and steps (every rank at one step)",
    "monitor_overhead": "noise-scale monitor on/off throughput >= 0.98",
    "monitor_floor": "measured: the monitor's arithmetic no exact estimator skips",
    "gns_accuracy": "noise scale within 20 % of the known answer",
    "adaptive_batch": "adaptive batch >= 1.3x sooner to the target than the best static",
    "goodput": "goodput >= AdaptDL and >= 1.3x the best static batch, time to target",
    "dashboard_open": "a long history's dashboard opens in <= 1.5 s",
    "load": "16 subscribers + 100 set()/s: throughput >= 0.90 of idle, nothing lost",
    "resize": "measured: resize phases against a cold start",
    "sync": "measured: model averaging against large-batch SGD, time to accuracy",
    "frameworks": "Lightning and HF Trainer with the callback >= 0.98 of without",
    "faults": "every fault blamed on the right rank, restarted where asked, 0 records lost",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated benchmark names")
    ap.add_argument("--skip", default="", help="comma-separated benchmark names")
    a = ap.parse_args()
    only = {n for n in a.only.split(",") if n}
    skip = {n for n in a.skip.split(",") if n}
    unknown = (only | skip) - set(GOALS)
    if unknown:
        sys.exit(f"no benchmark named {', '.join(sorted(unknown))}: {', '.join(GOALS)}")
    names = [n for n in GOALS if (not only or n in only) and n not in skip]
    print(machine_facts(), flush=True)
    OUT.mkdir(exist_ok=True)
    rows = []
    for name in names:
        log = OUT / f"{name}.log"
        print(f"\n== {name}: {GOALS[name]} (output: {log})", flush=True)
        t0 = time.monotonic()
        with open(log, "w") as f:
            rc = subprocess.run([sys.executable, str(HERE / f"{name}.py")], stdout=f,
                                stderr=subprocess.STDOUT, cwd=HERE.parent, check=False
                                ).returncode
        lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        rows.append((name, rc, time.monotonic() - t0, last))
        print(f"   exit {rc} after {rows[-1][2]:.0f} s: {last[:150]}", flush=True)
    print("\n| benchmark | goal | verdict | minutes |\n|---|---|---|---|")
    for name, rc, seconds, _ in rows:
        verdict = "met" if rc == 0 and not GOALS[name].startswith("measured") else \
            "measured" if rc == 0 else "MISSED (or failed: see its log)"
        print(f"| {name} | {GOALS[name]} | {verdict} | {seconds / 60:.1f} |")
    bad = [name for name, rc, _, _ in rows if rc != 0]
    if bad:
        sys.exit(f"benchmarks that missed their goal or failed: {', '.join(bad)}")


if __name__ == "__main__":
    main()
