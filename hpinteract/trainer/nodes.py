"""A job on several nodes: where rank 0's coordinator can be reached from every node.

Runs in: every rank's training thread, once, in ``hpi.init`` (after rank 0's coordinator
started); and rank 0's coordinator (``advertised``).

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
import socket
from typing import Any

from ..protocol.rundir import RunDir, atomic_write_json, read_json
from .sync import StepSync

ANY = ("0.0.0.0", "::")  # noqa: S104 (names to recognise, not to bind)


def node_count() -> int:
    """The number of torchrun agents (nodes) of this job, from torchrun's environment."""
    return int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)


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
