"""Shared helpers of the benchmarks: paths, environment, machine facts, statistics, stream.

Runs in: the benchmark driver process (a client of the jobs; it never imports torch).
"""

from __future__ import annotations

import atexit
import importlib.metadata
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train.py"
OUT = HERE / "out"  # git-ignored


def private_home(keep: bool = False) -> Path:
    """A throw-away HPINTERACT_HOME, so the benchmarks leave nothing in the user's home."""
    home = Path(tempfile.mkdtemp(prefix="hpi-bench-"))
    os.environ["HPINTERACT_HOME"] = str(home)
    if not keep:
        atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


def job_env() -> dict[str, str]:
    """One intra-op thread per rank (2 ranks on 2 cores), as torchrun would set anyway."""
    return {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def torchrun() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def machine_facts() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())

    def ver(pkg: str) -> str:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return "-"

    return (f"machine: {usable} usable CPUs ({os.cpu_count()} online), {model}, "
            f"{platform.system()} {platform.release()}, load avg {load}\n"
            f"python {platform.python_version()}, torch {ver('torch')}, pyzmq {ver('pyzmq')}, "
            f"scikit-learn {ver('scikit-learn')}, hpinteract {ver('hpinteract')}")


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks; nan when empty."""
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return pct(values, 50)


class StreamWatcher(threading.Thread):
    """A live subscriber for the whole run: iterates ``job.stream()`` like a dashboard would.

    It keeps the latest step seen and, per metric record, the delay from the step's end
    (its ``time`` field, stamped by rank 0) to its arrival here. It is given a Job object of
    its own (``hpi.attach``), as a second notebook would be.
    """

    def __init__(self, job: Any) -> None:
        super().__init__(name="stream-watcher", daemon=True)
        self.job = job
        self.latest_step = -1
        self.metrics = 0
        self.events = 0
        self.lags_ms: list[float] = []
        self.cpu_s = 0.0  # this thread's CPU time: the client's share of the cost
        self.error: BaseException | None = None
        self._live = False  # history replayed at attach time is not a live delay

    def run(self) -> None:
        cpu0 = time.thread_time()
        try:
            for rec in self.job.stream(idle_s=0.2):
                if "kind" in rec:
                    self.events += 1
                    continue
                self.metrics += 1
                self.latest_step = max(self.latest_step, int(rec.get("step", -1)))
                lag = 1e3 * (time.time() - float(rec.get("time", time.time())))
                if self._live or lag < 1000:
                    self._live = True
                    self.lags_ms.append(lag)
        except BaseException as exc:  # reported by the driver
            self.error = exc
        self.cpu_s = time.thread_time() - cpu0


def round_ratios(results: dict[str, list[dict[str, Any]]], base: str, v: str, key: str,
                 invert: bool = False) -> list[float]:
    """variant/base of ``key`` per round (base/variant for costs, ``invert``)."""
    return [(b[key] / x[key]) if invert else (x[key] / b[key])
            for b, x in zip(results[base], results[v], strict=True)]


def wait_step(job: Any, step: int, timeout: float = 300.0) -> int:
    """Block until the job has published ``step`` (returns the latest); exit the benchmark
    with the job's state and logs if it ends or stalls first."""
    deadline = time.monotonic() + timeout
    while (latest := (job.status().get("latest") or {}).get("step", -1)) < step:
        if time.monotonic() > deadline or job.state.terminal:
            sys.exit(f"job {job.id} did not reach step {step}: {job.state.value}\n"
                     f"{job.logs()[-3000:]}")
        time.sleep(0.05)
    return int(latest)


def steps_per_s(job: Any, start: int, end: int, skip: int = 20) -> float:
    """Steps a second over steps [start + skip, end) of the job's metrics log (``skip``: the
    first steps after a start or a change, still warming up)."""
    m = job.metrics()
    seg = m[(m.step >= start + skip) & (m.step < end)]
    if len(seg) < 2:
        return float("nan")
    return (len(seg) - 1) / float(seg.time.iloc[-1] - seg.time.iloc[0])
