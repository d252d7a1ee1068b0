"""A job on several nodes, from the launching side: its spec, and one run directory that
every node shares when their ``HPINTERACT_HOME`` is on shared storage.

Runs in: client processes (``hpi.launch(nnodes=...)`` on each node). Each node makes the
same call with the same ``job_id``. Where the nodes share the home (a network file system,
as on most Slurm clusters), the first launcher creates the run directory and the others
join it: one job.json, one set of logs and checkpoints that every rank reads, and a record
per node (``nodes/<node>.json``: its host and supervisor). Where they do not, each node
has a run directory of its own (trainer/nodes.py hands rank 0's connection file to the
others), and what needs a shared one (restarts, an elastic node range) is refused by the
job at start-up with the reason.

``resume=`` and ``replay=`` work the same way: each node makes the call, the first to
claim the ended job's resumption writes the new spec and the others join it
(``resume_node``); a replay is a new job id, created by the first and joined by the others.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from ..protocol.errors import ConfigError, InvalidState
from ..protocol.rundir import RunDir, atomic_write_json, home, read_json
from ..protocol.states import JobState

_RANGE = re.compile(r"^(\d+)(?::(\d+))?$")


def node_range(nnodes: int | str | None) -> tuple[int, int]:
    """``2`` -> (2, 2); ``"1:2"`` (torchrun's elastic range) -> (1, 2)."""
    m = _RANGE.match(str(1 if nnodes is None else nnodes).strip())
    if not m:
        raise ConfigError(f"nnodes must be N or MIN:MAX (torchrun's form), got {nnodes!r}")
    low = int(m.group(1))
    high = int(m.group(2) or low)
    if low < 1 or high < low:
        raise ConfigError(f"nnodes must be at least 1 and MIN <= MAX, got {nnodes!r}")
    return low, high


def nodes_spec(nnodes: int | str | None, rdzv_endpoint: str | None, job_id: str | None,
               ip: str | None) -> dict[str, Any]:
    """The spec's entries for a job on several nodes (and the coordinator's address)."""
    out: dict[str, Any] = {}
    if ip is not None:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(f"ip must be an IP address to bind, got {ip!r}") from None
        out["ip"] = ip
    low, high = node_range(nnodes)
    if high == 1:
        if rdzv_endpoint is not None:
            raise ConfigError("rdzv_endpoint is for a job on several nodes: give nnodes too")
        return out
    n = f"{low}:{high}" if low != high else high
    if not rdzv_endpoint or ":" not in rdzv_endpoint:
        raise ConfigError(f"a job on {n} nodes needs rdzv_endpoint='host:port' (where the "
                          "nodes meet), the same on every node")
    if not job_id:
        raise ConfigError(f"a job on {n} nodes needs job_id=..., the same on every node "
                          "(its rendezvous id)")
    return {**out, "nnodes": n, "rdzv_endpoint": rdzv_endpoint, "rdzv_id": job_id}


def node_run_dir(job_id: str, root: Path | None, extra: dict[str, Any]) -> tuple[RunDir, bool]:
    """The run directory of this node's part: a new one, or (True) the one another node of
    the same job made in this shared home."""
    try:
        return RunDir.create(job_id, root), False
    except FileExistsError:
        pass
    existing = RunDir((root or home()) / "jobs" / job_id)
    deadline = time.monotonic() + 10.0  # the other launcher may be writing its spec
    while (spec := read_json(existing.job_file)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if spec is None or spec.get("rdzv_id") != job_id or spec.get(
            "rdzv_endpoint") != extra.get("rdzv_endpoint"):
        raise ConfigError(f"job id {job_id!r} is taken under {existing.path.parent} by "
                          "another job: choose another id")
    if str(spec.get("nnodes")) != str(extra.get("nnodes")):
        raise ConfigError(f"job {job_id} was launched with nnodes={spec.get('nnodes')} on "
                          f"another node; this node asked for {extra.get('nnodes')}")
    return existing, True


def new_node_name() -> str:
    """Unique per launch: two "nodes" may share a host (tests, a big machine)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def record_node(run_dir: RunDir, node: str, supervisor_pid: int) -> None:
    folder = run_dir.nodes_dir
    folder.mkdir(exist_ok=True, mode=0o700)
    atomic_write_json(folder / f"{node}.json", {"node": node, "host": socket.gethostname(),
                                                "supervisor_pid": supervisor_pid,
                                                "started": time.time()})


def node_records(run_dir: RunDir) -> list[dict[str, Any]]:
    return [rec for p in sorted(run_dir.nodes_dir.glob("*.json"))
            if (rec := read_json(p)) is not None]


def resume_node(run_dir: RunDir, state: JobState, endpoint: str, wait_s: float = 10.0
                ) -> bool:
    """Whether this node joins a resumption another node of the job began (True) or begins
    it (False: the caller checks the job and writes the new spec).

    The nodes make the same ``launch(resume=...)`` call at about the same time. The ended
    state's time names the end being resumed: the first node to create the claim for it
    (``O_EXCL``, atomic on a shared file system) resumes, the others wait for its spec.
    A node that comes after the spec and the "starting" state were written joins them.
    ``state``: the job's (Job.state, which tells a dead job from a running one)."""
    spec = read_json(run_dir.job_file) or {}
    if not state.terminal:
        if spec.get("resume"):  # another node resumed it a moment ago: this one joins
            return _same_endpoint(run_dir, spec, endpoint)
        raise InvalidState(f"job {run_dir.job_id} is {state.value}: stop it (and wait for "
                           "it to end) before resuming it")
    recorded = read_json(run_dir.state_file) or {}
    ended = float(recorded.get("updated") or run_dir.state_file.stat().st_mtime)
    folder = run_dir.nodes_dir
    folder.mkdir(exist_ok=True, mode=0o700)
    try:
        fd = os.open(folder / f"resume-of-{ended:.6f}.claim",
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        deadline = time.monotonic() + wait_s  # the first node is writing its spec
        while time.monotonic() < deadline:
            spec = read_json(run_dir.job_file) or {}
            if float((spec.get("resume") or {}).get("at", 0)) > ended:
                return _same_endpoint(run_dir, spec, endpoint)
            time.sleep(0.05)
        raise ConfigError(f"another node claimed the resumption of job {run_dir.job_id} but "
                          f"wrote no spec within {wait_s:g} s") from None
    os.close(fd)
    for old in folder.glob("*.json"):  # the ended launch's nodes: none of them runs now
        old.unlink(missing_ok=True)
    return False



def _same_endpoint(run_dir: RunDir, spec: dict[str, Any], endpoint: str) -> bool:
    if spec.get("rdzv_endpoint") != endpoint:
        raise ConfigError(f"job {run_dir.job_id} is being resumed by another node at "
                          f"rdzv_endpoint={spec.get('rdzv_endpoint')}; this node asked for "
                          f"{endpoint}")
    return True
