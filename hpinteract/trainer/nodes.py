"""A job on several nodes: the job's attempt, whether the nodes share the run directory,
and where rank 0's coordinator can be reached from every node.

Runs in: every rank's training thread, once, in ``hpi.init`` (``nodes_start`` on rank 0
and ``join_nodes`` on every rank, in its first exchange; ``share_connection`` after rank
0's coordinator started); and rank 0's coordinator (``advertised``).

torchrun counts restarts per agent (``TORCHELASTIC_RESTART_COUNT``), and the agents of one
job disagree: an agent that restarts because another node failed or joined may not count
it. So on several nodes rank 0 numbers the job's attempts itself, in the run directory,
and tells every rank (restart.py's ``attempt``): which checkpoint to resume from, where
the failure records go. Restarts and an elastic node range need every rank to read the
same checkpoints, so the nodes must share the run directory; rank 0 writes a token there
and every rank looks for it in its own, and a job that would need it refuses to start
without it, saying why.

torchrun's c10d rendezvous decides which node's agent holds global rank 0 (its sorted
order of the agents), so a launcher cannot know in advance where the coordinator will
run. Each node's launcher made a run directory of its own; rank 0 hands its connection
file to every rank with the job's control collective, and local rank 0 of each other node
writes it, owner-only, into its node's run directory. A client attaches through whichever
node it can read. The file travels over the job's own gloo connections, unencrypted like
every message of torch.distributed: the nodes' network is trusted as torch trusts it (see
docs/RELIABILITY.md).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import Any

import torch
import torch.distributed as dist

from ..protocol.errors import ConfigError
from ..protocol.rundir import RunDir, atomic_write_json, read_json
from .restart import resized, set_job_attempt
from .sync import StepSync

ANY = ("0.0.0.0", "::")  # noqa: S104 (names to recognise, not to bind)

_shared: bool = False  # every node shares rank 0's run directory (join_nodes)


def node_count() -> int:
    """The number of torchrun agents (nodes) of this job, from torchrun's environment."""
    return int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)


def nodes_shared() -> bool:
    """Whether this job's nodes share one run directory (False on one node)."""
    return _shared


def nodes_start(run_dir: RunDir) -> dict[str, Any]:
    """Rank 0, on several nodes: this attempt's number (counted in the run directory, per
    launch) and the token the other nodes look for in theirs."""
    if node_count() <= 1:
        return {}
    job = read_json(run_dir.job_file) or {}
    # A resume= or a resize starts counting again, as a new torchrun does on one node.
    launch = f"{job.get('resumes', 0)}/{(resized() or {}).get('boundary', '')}"
    prev = read_json(run_dir.path / "attempt.json") or {}
    number = int(prev.get("attempt", -1)) + 1 if prev.get("launch") == launch else 0
    atomic_write_json(run_dir.path / "attempt.json",
                      {"launch": launch, "attempt": number, "started": time.time()})
    token = secrets.token_hex(8)
    atomic_write_json(run_dir.path / "nodes-check.json", {"token": token})
    return {"attempt": number, "token": token, "nnodes": str(job.get("nnodes", node_count()))}


def join_nodes(first: dict[str, Any], own: str | None, group: Any) -> bool:
    """Every rank, on several nodes: the job's attempt in force, and whether every node
    shares rank 0's run directory (a collective: the same answer on every rank)."""
    if "token" not in first:
        return False
    set_job_attempt(int(first["attempt"]))
    # Under a user's own torchrun no launcher made a run directory here: rank 0's path is
    # this node's too where the nodes share the file system.
    mine = read_json(RunDir(own or first["run_dir"]).path / "nodes-check.json")
    here = torch.tensor([int(mine is not None and mine.get("token") == first["token"])])
    dist.all_reduce(here, op=dist.ReduceOp.MIN, group=group)
    shared = bool(here.item())
    global _shared
    _shared = shared
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    elastic = ":" in str(first.get("nnodes", ""))
    if not shared and (restarts or elastic):
        why = f"max_restarts={restarts}" if restarts else f"nnodes={first['nnodes']}"
        raise ConfigError(
            f"a job on several nodes with {why} needs one run directory that every node "
            "shares, so that every rank reads the same checkpoints: launch each node with "
            "the same HPINTERACT_HOME on shared storage (a network file system); here at "
            "least one node has a run directory of its own")
    return shared


def advertised(ip: str) -> str:
    """The address clients are given: the host's name when bound to every interface."""
    return socket.getfqdn() if ip in ANY else ip


def share_connection(sync: StepSync, rank: int, local_rank: int, run_dir: RunDir) -> None:
    """Every rank: rank 0's connection file into each other node's run directory."""
    mine: list[dict[str, Any]] | None = None
    if rank == 0:
        mine = [{"op": "connection", "host": socket.gethostname(), "run_dir": str(run_dir.path),
                 "file": read_json(run_dir.connection)}]
    got = sync.exchange(mine)[0]
    here = (socket.gethostname(), str(run_dir.path))
    if local_rank == 0 and rank != 0 and (got["host"], got["run_dir"]) != here \
            and isinstance(got.get("file"), dict):
        atomic_write_json(run_dir.connection, got["file"], mode=0o600)
