"""Automatic restarts: which torchrun attempt this is, and what made the last one fail.

Runs in: every rank (``attempt``, ``restarts_left``) and rank 0 before its coordinator
opens the logs (``previous_failure``, for the ``restart`` event). torchrun
(``--max-restarts``) restarts every worker when one dies; the new workers find the
attempt number in ``TORCHELASTIC_RESTART_COUNT`` and continue from the job's newest
checkpoint (see resume.py).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..protocol.failures import attempt_cause, cause, failures_dir, merge, summary
from ..protocol.rundir import RunDir

# Set by the supervisor, which sees torchrun's exit statuses and records the job's end: a
# rank under it never writes a terminal failure itself (ending.py).
SUPERVISED_ENV = "HPINTERACT_SUPERVISED"
# The record of a resize (resize.py), as the supervisor passes it to the relaunched ranks.
RESIZED_ENV = "HPINTERACT_RESIZED"


_job_attempt: int | None = None  # on several nodes: rank 0's count (trainer/nodes.py)


def set_job_attempt(number: int) -> None:
    global _job_attempt
    _job_attempt = number


def attempt() -> int:
    """How often this job's workers were restarted (0: the first attempt): torchrun's count
    on one node; on several, rank 0's count of the job's attempts (the agents' differ)."""
    if _job_attempt is not None:
        return _job_attempt
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def resized() -> dict[str, Any] | None:
    """In the ranks of a resized job: the record of the resize (None otherwise)."""
    raw = os.environ.get(RESIZED_ENV)
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def supervised() -> bool:
    return os.environ.get(SUPERVISED_ENV) == "1"


def restarts_left() -> int:
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) - attempt()


def error_files(run_dir: RunDir, number: int) -> dict[int, str]:
    """The messages of torchrun's per-rank error files of attempt ``number`` (``@record``)."""
    out: dict[int, str] = {}
    for path in run_dir.logs_dir.glob(f"torchrun/*/attempt_{number}/*/error.json"):
        try:
            message = json.loads(path.read_text()).get("message")
        except (OSError, ValueError):
            continue
        if isinstance(message, dict):
            message = message.get("message")
        out[int(path.parent.name)] = str(message)
    return out


def previous_failure(run_dir: RunDir, number: int) -> dict[str, Any]:
    """What made attempt ``number`` fail, for the restart event: the supervisor's record of
    the exit statuses (a rank killed by a signal is named by it) and the ranks' own records
    (protocol/failures.py); where neither was written, torchrun's error files."""
    found = attempt_cause(run_dir, number)
    if found is None:
        files = error_files(run_dir, number)
        if not files:
            return {"failed_rank": None, "error": "no rank of the attempt left a record of "
                                                  "its failure"}
        found = cause({r: merge(r, {"message": m}, None) for r, m in files.items()})
    return {"failed_rank": found["rank"], "error": summary(found), "failed_kind": found["kind"],
            "signal": found.get("signal"), "exitcode": found.get("exitcode"),
            "failed_step": found.get("step"), "consequences": found.get("consequences", [])}


def lost_nodes(run_dir: RunDir, number: int, count: int) -> list[str]:
    """Rank 0 of a job on several nodes that shrank: the ``count`` nodes lost in attempt
    ``number``, where that can be told. Every node whose ranks failed has its agent's
    record of the attempt (``torchrun-<node>.json``); a node that went away whole (the
    machine, or its supervisor and agent too) has none. Named only when exactly
    ``count`` nodes of the launch lack one (a node restarted without a failure of its
    own writes none either)."""
    recorded = {p.stem.removeprefix("torchrun-")
                for p in failures_dir(run_dir, number).glob("torchrun-*.json")}
    silent = sorted(p.stem for p in run_dir.nodes_dir.glob("*.json")) if \
        run_dir.nodes_dir.is_dir() else []
    silent = [n for n in silent if n not in recorded]
    return silent if len(silent) == count else []
