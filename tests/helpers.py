"""Helpers shared by the tests (importable as ``helpers``: pytest puts tests/ on the path)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
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
        if getattr(value, "shape", None) == ():  # a numpy scalar: np.False_ is not False
            value = bool(value)
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


def job_pids(run_dir: Path | None, *also: bytes) -> list[int]:
    """Every process started for this run directory (they all carry it in their
    environment: the supervisor, torchrun's agent inside it, the ranks), or only those
    whose environment also holds each of ``also`` (``b"RANK=1"``). Without a run directory
    (a user's own torchrun sets none), every process that holds each of ``also``."""
    want = f"HPINTERACT_RUN_DIR={run_dir}".encode() if run_dir is not None else also[0]
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                env = (p / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if want in env and all(a in env for a in also):
                pids.append(int(p.name))
    return pids


def rank_pid(job: hpi.Job, rank: int) -> int:
    """The process of one rank of a launched job (on this machine)."""
    [pid] = job_pids(job.run_dir.path, f"RANK={rank}".encode(), f"LOCAL_RANK={rank}".encode())
    return pid


def trace(job: hpi.Job, rank: int) -> list[dict]:
    return json.loads((job.run_dir.path / f"trace_{rank}.json").read_text())


@contextlib.contextmanager
def started_by_hand(cmd: list[str], cwd: Path, timeout: float = 120.0) -> Iterator[hpi.Job]:
    """Run ``cmd``, a training script started outside hpi.launch (by hand, by Lightning's
    launcher, by accelerate), and yield the job it made, found as a user finds it (the new
    one, which is ``hpi.attach("latest")``). On leaving, wait for the script to exit and
    fail with its output unless it exited 0; it is killed if it outlives that or the body
    raised. Fails at once, with the output, if the script exits before making a job."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HPINTERACT_RUN_DIR", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    before = {j.id for j in hpi.jobs()}
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)

    def new() -> list[hpi.JobSummary]:
        if proc.poll() is not None:
            raise AssertionError(f"the script exited ({proc.returncode}):\n"
                                 f"{proc.stdout.read() if proc.stdout else ''}")
        return [j for j in hpi.jobs() if j.id not in before]

    try:
        job = hpi.attach(until(new, timeout=timeout, what="the job's run directory")[0].id)
        assert job.id == hpi.attach("latest").id
        yield job
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
