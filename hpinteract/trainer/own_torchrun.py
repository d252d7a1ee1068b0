"""The run directory of a job started by a user's own ``torchrun`` (no launcher made one).

Runs in: every rank's training thread, once, in ``hpi.init`` before its first exchange:
rank 0 chooses the directory (``run_dir_for_rank0``), local rank 0 of every node records
its agent (``record_agent``).

torchrun restarts the workers (``--max-restarts``, or a node joining an elastic range) in
the same agent process, with the same ``TORCHELASTIC_RUN_ID`` (its ``--rdzv-id``; a fresh
uuid for ``--standalone``). A restarted rank 0 must find the directory of the first
attempt, whose checkpoints it resumes from, and not make a new job of each attempt. A run
id alone does not tell a restart from a new ``torchrun`` given the same ``--rdzv-id``
(Slurm scripts reuse names): the agent does. Each node's local rank 0 leaves a mark of its
agent (host, pid and the process's start time, so that a container's agent with the same
pid in a later run is not taken for it) under ``$HPINTERACT_HOME/torchrun/<run id>/``; a
rank 0 whose agent has a mark there is a restart of that run, whichever node it is on.
Where the nodes do not share the home, each mark is on its own node: a restart whose rank
0 landed on another node makes a new job there, and ``trainer/nodes.py`` refuses restarts
without a shared home anyway.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from ..protocol.rundir import RunDir, atomic_write_json, home, read_json

FOLDER = "torchrun"  # under the home: one folder per torchrun run id


def _folder() -> Path | None:
    """None where the workers are never restarted (nothing to find again): no torchrun,
    or one node without ``--max-restarts``."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id or run_id == "none":
        return None
    if not int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) and \
            int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1) == 1:
        return None
    return home() / FOLDER / re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:128]


def _agent_mark() -> str:
    """This process's torchrun agent (its parent): host, pid and start time in ticks."""
    ppid = os.getppid()
    try:
        # The start time is field 22 of /proc/<pid>/stat; the name in field 2 may hold
        # spaces, so count from its closing parenthesis.
        stat = Path(f"/proc/{ppid}/stat").read_text()
        started = stat[stat.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        started = "0"
    return f"{socket.gethostname()}-{ppid}-{started}"


def run_dir_for_rank0() -> RunDir:
    """Rank 0: the run directory of this torchrun run, made by its first attempt."""
    folder = _folder()
    if folder is not None:
        known = read_json(folder / "run_dir.json") or {}
        path = known.get("run_dir")
        if path and (folder / _agent_mark()).exists() and Path(path).is_dir():
            return RunDir(path)  # a restart in an agent that ran this job before
    run_dir = RunDir.create()
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_json(folder / "run_dir.json", {"run_dir": str(run_dir.path)})
    return run_dir


def record_agent() -> None:
    """Local rank 0 of every node: the mark of its agent (see the module's docstring)."""
    folder = _folder()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    (folder / _agent_mark()).touch(mode=0o600)
