"""Process groups: set-up for scripts that have, or have not, initialised torch.distributed,
and the tear-down at the end.

Runs in: every rank. torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...) is used as
is; a script run with plain ``python`` becomes a one-rank job. NCCL is chosen when CUDA is
present (one GPU per rank, by LOCAL_RANK), gloo otherwise; ``backend`` overrides. The
control collectives always use their own gloo group, whatever the training backend.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..protocol.errors import ConfigError


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    created_group: bool  # we initialised the default group, so we destroy it at the end

    @property
    def devices(self) -> int | None:
        """GPUs on this node (one rank each), or None on CPU."""
        return torch.cuda.device_count() if self.device.type == "cuda" else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"


def attempt_store(store: Any) -> Any:
    """The rendezvous store seen through this torchrun attempt's own key prefix.

    torchrun's agent keeps one TCP store across worker restarts, and gloo finds its peers
    by keys such as ``0/rank_1``: a restarted rank could read the address a dead worker of
    the previous attempt wrote there and fail with "connection refused". Every group made
    from the default one inherits the prefix, the control group included. On several nodes
    the agents' restart counts differ (a node that joins starts at 0), so there the
    supervisor has torchrun give each rendezvous round a store of its own instead
    (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``, supervisor.py), and no count is needed.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return dist.PrefixStore("hpinteract/attempt", store)  # a new store every round
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if restarts and int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1) > 1:
        # A user's own torchrun (hpi.launch's supervisor sets the variable below). An agent
        # counts a restart when its own ranks failed, not when it restarts because another
        # node's did: the restarted ranks would wait for each other under two prefixes.
        raise ConfigError(
            f"a job on several nodes with torchrun's --max-restarts {restarts} needs a "
            "store per rendezvous round: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every "
            "node's environment before torchrun (hpi.launch and `hpinteract run` do)")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"
    return dist.PrefixStore(f"hpinteract/attempt_{attempt}", store)


def ensure_process_group(backend: str | None = None) -> Topology:
    created = False
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        chosen = backend or os.environ.get("HPINTERACT_BACKEND") or default_backend()
        if chosen == "nccl":
            torch.cuda.set_device(local_rank)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            store, rank, world_size = next(dist.rendezvous("env://"))
            dist.init_process_group(chosen, store=attempt_store(store), rank=rank,
                                    world_size=world_size)
        else:  # plain `python train.py`: a job of one rank
            dist.init_process_group(
                chosen, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
            )
        created = True
    used = str(dist.get_backend())
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if "nccl" in used and torch.cuda.is_available()
        else torch.device("cpu")
    )
    return Topology(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank,
        backend=used, device=device, created_group=created,
    )


def control_group() -> Any:
    """A gloo group for the step-boundary word: CPU tensors, never the CUDA stream."""
    return dist.new_group(backend="gloo")


def leave_together(group: Any, topo: Topology) -> None:
    """The ranks' last rendezvous, then the groups hpinteract made are destroyed. Ranks
    that tear gloo down at different moments sometimes abort at exit ("terminate called
    without an active exception"), failing a finished job. A script that destroyed the
    process groups itself has nothing left to tear down."""
    with contextlib.suppress(RuntimeError, ValueError):
        dist.barrier(group=group)
        dist.destroy_process_group(group)
        if topo.created_group:
            dist.destroy_process_group()
