"""What failed and why: each rank's record of its own failure, and the one root cause of a
failed attempt, chosen from those records and what torchrun saw (exit codes, signals).

Runs in: every rank's exception hook (``write_rank_failure``); the supervisor (``cause``,
after each failed attempt and at the job's end, where torchrun's exit statuses are known);
rank 0 of a restarted attempt (the ``restart`` event); clients of a job that plain torchrun
started (``Job.error``, where the rank records are all there is).

The rule is torchelastic's "first failure", made robust to what breaks it: when a rank
dies, its peers raise a communication error within milliseconds, sometimes before the
agent notices the death, and torchrun's timestamps are whole seconds (for a signal death,
the time of polling). So the kind of failure decides first and time only within a kind: a
rank's own exception, then a death by a signal other than SIGTERM, then an exit code
without an exception, then a rank stopped by SIGTERM, and last a rank that only lost a
peer. Every other failure of the attempt is listed as a consequence.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

from .rundir import RunDir, atomic_write_json, read_json

# What a rank raises when a peer vanished under a collective, or when torchrun stopped it
# after another rank failed (trainer/sigterm.py): a consequence, not a cause.
_PEER_LOSS = re.compile(
    r"Connection closed by peer|Connection reset by peer|ECONNRESET|Broken pipe|"
    r"NCCL communicator was aborted|DistNetworkError|stopped by SIGTERM", re.IGNORECASE)
_SIGTERM = re.compile(r"stopped by SIGTERM", re.IGNORECASE)

# Kinds, most telling first (the order ``cause`` ranks them in).
KINDS = ("exception", "hang", "signal", "exit", "stopped", "waiting", "lost_peer")


def is_peer_loss(message: Any) -> bool:
    return bool(_PEER_LOSS.search(str(message)))


def failures_dir(run_dir: RunDir, attempt: int) -> Path:
    return run_dir.path / "failures" / f"attempt-{attempt}"


def signal_name(exitcode: int | None) -> str | None:
    """``SIGKILL`` for an exit status of -9 (how subprocess reports a signal death)."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def write_rank_failure(run_dir: RunDir, attempt: int, rank: int, step: int,
                       etype: str, message: str, traceback: str, kind: str | None = None,
                       extra: dict[str, Any] | None = None) -> None:
    """A rank's own account of why it is ending (its exception hook, or the hang watchdog
    with the frame it found: ``extra``); an owner-only file."""
    kind = kind or ("stopped" if _SIGTERM.search(message) else
                    "lost_peer" if is_peer_loss(message) else "exception")
    where = failures_dir(run_dir, attempt)
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_json(where / f"rank-{rank}.json", {
        "rank": rank, "kind": kind, "type": etype, "message": message,
        "traceback": traceback, "step": step, "pid": os.getpid(),
        "host": socket.gethostname(), "time": time.time(), **(extra or {})})


def read_rank_failures(run_dir: RunDir, attempt: int) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for path in failures_dir(run_dir, attempt).glob("rank-*.json"):
        rec = read_json(path)
        if rec is not None and isinstance(rec.get("rank"), int):
            out[rec["rank"]] = rec
    return out


def write_seen(run_dir: RunDir, attempt: int, seen: dict[int, dict[str, Any]],
               step: int | None, oom_killed: bool, node: str | None = None) -> None:
    """What torchrun's agent saw of a failed attempt (the supervisor, before a restart);
    on several nodes sharing the run directory, each node's agent its own ranks."""
    where = failures_dir(run_dir, attempt)
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_json(where / (f"torchrun-{node}.json" if node else "torchrun.json"), {
        "attempt": attempt, "step": step, "oom_killed": oom_killed, "node": node,
        "failures": {str(r): f for r, f in seen.items()}})


def attempt_cause(run_dir: RunDir, attempt: int) -> dict[str, Any] | None:
    """The root cause of attempt ``attempt`` from every record of it (every node's agent's
    and every rank's), or None when nothing of it was recorded."""
    seen: dict[int, dict[str, Any]] = {}
    steps: list[int] = []
    oom = False
    for path in sorted(failures_dir(run_dir, attempt).glob("torchrun*.json")):
        seen_file = read_json(path) or {}
        seen.update({int(r): f for r, f in (seen_file.get("failures") or {}).items()
                     if isinstance(f, dict)})
        steps += [seen_file["step"]] if isinstance(seen_file.get("step"), int) else []
        oom = oom or bool(seen_file.get("oom_killed"))
    own = read_rank_failures(run_dir, attempt)
    if not seen and not own:
        return None
    merged = {r: merge(r, seen.get(r), own.get(r)) for r in sorted(set(seen) | set(own))}
    return cause(merged, max(steps, default=None), oom)


def attempts(run_dir: RunDir) -> list[int]:
    """The attempts that recorded a failure, oldest first."""
    return sorted(int(p.name.split("-", 1)[1]) for p in (run_dir.path / "failures").glob(
        "attempt-*") if p.name.split("-", 1)[1].isdigit())


def latest_cause(run_dir: RunDir) -> dict[str, Any] | None:
    """The root cause of the newest attempt that recorded a failure, if any did."""
    for number in reversed(attempts(run_dir)):
        found = attempt_cause(run_dir, number)
        if found is not None:
            return found
    return None


def merge(rank: int, seen: dict[str, Any] | None, own: dict[str, Any] | None
          ) -> dict[str, Any]:
    """One rank's failure from torchrun's view (``seen``: exitcode, pid, message of its
    error file, timestamp) and its own record (``own``), either of which may be missing."""
    seen, own = seen or {}, own or {}
    exitcode = seen.get("exitcode")
    sig = signal_name(exitcode)
    out: dict[str, Any] = {"rank": rank, "exitcode": exitcode, "signal": sig,
                           "pid": seen.get("pid") or own.get("pid"), "host": own.get("host"),
                           "step": own.get("step"), "type": own.get("type"),
                           "traceback": own.get("traceback"), "frame": own.get("frame"),
                           "time": own.get("time") or seen.get("timestamp") or 0.0}
    if own.get("kind") in KINDS:
        out["kind"], out["message"] = own["kind"], str(own.get("message", ""))
    elif sig is not None:
        out["kind"] = "stopped" if sig == "SIGTERM" else "signal"
        out["message"] = f"killed by {sig} (signal {-int(exitcode or 0)})"
    elif seen.get("message"):
        message = str(seen["message"])
        out["kind"] = ("stopped" if _SIGTERM.search(message) else
                       "lost_peer" if is_peer_loss(message) else "exception")
        out["message"] = message
    else:
        out["kind"] = "exit"
        out["message"] = f"exited with code {exitcode} without raising an exception"
    return out


def cause(failures: dict[int, dict[str, Any]], step: int | None = None,
          oom_killed: bool = False) -> dict[str, Any]:
    """The root cause of an attempt (``merge``d failures by rank), as the state file and the
    events record it: the rank, what happened, and the other ranks' failures as
    consequences. ``step``: the step the job was in (the one after the last logged)."""
    if not failures:
        return {"rank": None, "kind": "unknown", "message": "no rank recorded a failure",
                "consequences": []}
    rank = min(failures, key=lambda r: (KINDS.index(failures[r]["kind"]),
                                        float(failures[r]["time"] or 0.0), r))
    root = dict(failures[rank])
    if root.get("step") is None:
        # A rank killed by a signal said nothing; the ranks run in lockstep, so the step
        # its peers were in (their own records) is the one it was in. ``step``, read from
        # the log when the attempt failed, may miss the last few steps' records.
        known = [f["step"] for f in failures.values() if f.get("step") is not None]
        root["step"] = max([*known, *([step] if step is not None else [])], default=None)
    if root["kind"] == "signal" and root["signal"] == "SIGKILL" and oom_killed:
        root["oom_kill"] = True
        root["message"] += ("; the kernel's OOM killer ran in this job's cgroup meanwhile "
                            "(memory.events)")
    if root["kind"] == "stopped":  # the first to be stopped: not torchrun's doing
        root["message"] = ("received SIGTERM before any rank failed (from outside the job: a "
                           "preemption, scancel, kill)")
    if root["kind"] in ("signal", "exit", "stopped") and root.get("step") is not None:
        root["message"] += f" during step {root['step']}"
    if root["kind"] == "hang":  # every rank that did not reach the step, with its frame
        hung = [r for r in sorted(failures) if failures[r]["kind"] == "hang"]
        root["ranks"] = hung
        if len(hung) > 1:
            root["message"] = "; ".join(f"rank {r}: {failures[r]['message']}" for r in hung)
    if root["kind"] == "waiting":
        root["rank"] = None  # each rank waited for the others: none can be blamed alone
        root["message"] = ("every rank waited in a collective (a collective that not all "
                           f"ranks call?): {root['message']}")
    if root["kind"] == "lost_peer":
        # Only a consequence was seen: no rank is blamed, and the survivor's exit status
        # is not the cause's.
        root.update(rank=None, seen_by=rank, exitcode=None, signal=None, pid=None)
        root["message"] = (f"rank {rank} lost a peer that left no record of its own (killed "
                           f"by a signal outside torchrun's view?): {root['message']}")
    root["consequences"] = [
        {k: failures[r].get(k) for k in ("rank", "kind", "message", "exitcode", "signal")}
        for r in sorted(failures) if r != rank]
    return root


def summary(error: dict[str, Any]) -> str:
    """One line for a person: ``rank 1 failed: killed by SIGKILL (signal 9) during step 31;
    then rank 0 lost its peer``."""
    rank, message = error.get("rank"), str(error.get("message", ""))
    if error.get("kind") == "exception" and error.get("type"):
        message = f"{error['type']}: {message}"
    where = f"rank {rank}" if rank is not None else "the job"
    after = [f"rank {c.get('rank')} {_AFTER.get(str(c.get('kind')), 'failed too')}"
             for c in error.get("consequences") or () if isinstance(c, dict)]
    return f"{where} failed: {message}" + (
        f"; then {', '.join(after)}" if after else "")


_AFTER = {"lost_peer": "lost its peer", "stopped": "was stopped (SIGTERM)",
          "waiting": "waited for it in a collective"}


def oom_kills() -> int | None:
    """The kernel's count of OOM kills in this process's cgroup (v2 ``memory.events``), or
    None where it cannot be read."""
    try:
        line = Path("/proc/self/cgroup").read_text().splitlines()[0]
        events = Path("/sys/fs/cgroup") / line.split(":", 2)[2].lstrip("/") / "memory.events"
        for row in events.read_text().splitlines():
            name, _, value = row.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, IndexError, ValueError):
        return None
    return None
