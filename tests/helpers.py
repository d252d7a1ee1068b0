"""Helpers shared by the tests (importable as ``helpers``: pytest puts tests/ on the path)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import hpinteract as hpi

JOBS = Path(__file__).parent / "jobs"
EXAMPLES = Path(__file__).parents[1] / "examples"
TOY = JOBS / "toy.py"


def wait_for_step(job: hpi.Job, step: int, timeout: float = 90.0) -> int:
    """Block until the job has published metrics for ``step`` (returns the latest step)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = job.status()
        if st.get("state") in ("finished", "failed"):
            raise AssertionError(f"job ended early: {st.get('state')} {job.error}\n{job.logs()}")
        latest = st.get("latest") or {}
        if latest.get("step", -1) >= step:
            return int(latest["step"])
        time.sleep(0.05)
    raise AssertionError(f"job did not reach step {step} in {timeout}s\n{job.logs()}")


def until(cond, timeout=60.0, what="condition", poll_s=0.1):
    """Poll ``cond()`` until it gives something true (a non-empty value); return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value is not None and value is not False and (not hasattr(value, "__len__")
                                                         or len(value)):
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def proc_stat(path: str | Path) -> tuple[str, list[str]] | None:
    """A process's or thread's ``stat`` (``/proc/<pid>`` or ``.../task/<tid>``): its name
    and the fields after it (0: the state letter, 1: the parent, 16: the nice value), or
    None once it is gone. The name may hold spaces and parentheses: it ends at the last ')'."""
    try:
        stat = Path(path, "stat").read_text()
    except OSError:
        return None
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()


def trace(job: hpi.Job, rank: int) -> list[dict]:
    return json.loads((job.run_dir.path / f"trace_{rank}.json").read_text())


def job_started_by_hand(proc, before: set[str], timeout: float = 120.0) -> hpi.Job:
    """The job a script started outside hpi.launch (``proc``) made: the one whose id is not
    in ``before``; fails at once with the script's output if it exits first."""
    def new():
        if proc.poll() is not None:
            raise AssertionError(f"the script exited ({proc.returncode}):\n"
                                 f"{proc.stdout.read() if proc.stdout else ''}")
        return [j for j in hpi.jobs() if j.id not in before]

    return hpi.attach(until(new, timeout=timeout, what="the job's run directory")[0].id)
