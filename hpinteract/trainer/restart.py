"""Automatic restarts: which torchrun attempt this is, and what made the last one fail.

Runs in: every rank (``attempt``, ``restarts_left``); rank 0 before its coordinator opens
the logs (``previous_failure``, for the ``restart`` event) and the supervisor
(``is_peer_loss``). torchrun (``--max-restarts``) restarts every worker when one dies;
the new workers find the attempt number in ``TORCHELASTIC_RESTART_COUNT`` and continue from
the job's newest checkpoint (see resume.py).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ..protocol.rundir import RunDir

# What a rank raises when a peer vanished under a collective, or when torchrun stopped it
# after another rank failed (sigterm.py): a consequence, not a cause.
_PEER_LOSS = re.compile(
    r"Connection closed by peer|Connection reset by peer|ECONNRESET|Broken pipe|"
    r"NCCL communicator was aborted|DistNetworkError|stopped by SIGTERM", re.IGNORECASE)


def is_peer_loss(message: Any) -> bool:
    return bool(_PEER_LOSS.search(str(message)))


def attempt() -> int:
    """How often torchrun has restarted this job's workers (0: the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def restarts_left() -> int:
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) - attempt()


def previous_failure(run_dir: RunDir, number: int) -> dict[str, Any]:
    """What the error files of attempt ``number`` say: the rank that failed for its own
    reasons when one recorded an exception, else the peers' view. A rank killed by a
    signal writes none: then only its peers' "connection closed" tells of it."""
    found: list[tuple[bool, int, str]] = []
    for path in run_dir.logs_dir.glob(f"torchrun/*/attempt_{number}/*/error.json"):
        try:
            message = json.loads(path.read_text()).get("message")
        except (OSError, ValueError):
            continue
        if isinstance(message, dict):
            message = message.get("message")
        found.append((is_peer_loss(message), int(path.parent.name), str(message)))
    if not found:
        return {"failed_rank": None, "error": "a rank died without an error record "
                                              "(killed by a signal?)"}
    peer, rank, message = min(found)
    if peer:
        ranks = ", ".join(str(r) for _, r, _ in sorted(found, key=lambda f: f[1]))
        return {"failed_rank": None,
                "error": f"rank(s) {ranks} lost a peer that died without an error record "
                         f"(killed by a signal?): {message}"}
    return {"failed_rank": rank, "error": message}
