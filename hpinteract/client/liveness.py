"""Whether a job's processes still run: what tells a job that died without recording its
end (kill -9, OOM killer) from one that is still starting or training.

Runs in: client processes (``Job.state``, ``Job.wait``). A job launched by ``hpi.launch``
lives as long as its supervisor; one started by plain torchrun as long as its rank 0. A job
of another machine (a shared run directory) cannot be checked from here: its state file is
all there is.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
from collections.abc import Callable
from typing import Any


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs: an exited process that its parent has not reaped yet (a
    zombie, such as another node's supervisor launched from this same kernel) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, but someone else's
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # no /proc (macOS), or it has just gone
        return False
    # "pid (comm) S ...": the state follows the last ")" (comm may hold one).
    state = stat.rfind(b")") + 2
    return stat[state : state + 1] == b"Z"


def process_alive(spec: dict[str, Any], pid: Any) -> bool | None:
    """Whether a process of this job runs; None when that cannot be known from here (no
    pid, or another machine's job)."""
    if pid is None or spec.get("hostname", socket.gethostname()) != socket.gethostname():
        return None
    return pid_alive(int(pid))


def supervisor_running(spec_of: Callable[[], dict[str, Any]],
                       process: subprocess.Popen[bytes] | None,
                       nodes_of: Callable[[], list[dict[str, Any]]] = list) -> bool | None:
    """``spec_of`` reads job.json: only when this process did not start the supervisor
    (``Job.state`` asks on every request, and a launching client needs no file read).
    ``nodes_of``: the nodes of a job on several that share the run directory; the job lives
    while any node's supervisor does."""
    if process is not None and process.poll() is None:  # polling also reaps it
        return True
    nodes = nodes_of()
    if nodes:
        alive = [process_alive({"hostname": n.get("host")}, n.get("supervisor_pid"))
                 for n in nodes]
        return True if True in alive else None if None in alive else False
    if process is not None:
        return False
    spec = spec_of()
    return process_alive(spec, spec.get("supervisor_pid"))


def job_alive(spec_of: Callable[[], dict[str, Any]], process: subprocess.Popen[bytes] | None,
              state: dict[str, Any],
              nodes_of: Callable[[], list[dict[str, Any]]] = list) -> bool:
    """False only when it is known that none of the job's processes runs."""
    spec_of = functools.cache(spec_of)  # read job.json at most once, and only if needed
    running = supervisor_running(spec_of, process, nodes_of)
    if running is None:  # started by a user's own torchrun: its agent is the job's life
        # (it restarts the ranks), or rank 0's process where there is none.
        running = process_alive(spec_of(), state.get("agent_pid") or state.get("pid"))
    return running is not False
