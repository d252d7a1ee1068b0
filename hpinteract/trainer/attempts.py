"""Each failed attempt's exit statuses, written where the restart logic and the end read them.

Runs in: the supervisor, around torchrun's elastic agent (which runs in the same process).
With ``--max-restarts``, the agent restarts a failed attempt's workers by itself and keeps
what it saw (each rank's exit code, signal, pid, error file) to itself: its worker events
are recorded only when the whole run ends. A rank killed by a signal writes nothing, so
without this the restart event could name no one. There is no public hook for a failed
attempt, so the agent's monitoring step is wrapped: it is a private method of
``LocalElasticAgent`` (there since torch 1.9); where a torch lacks it, restarts name
the cause only when a rank recorded one itself, and the job's end is unaffected.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..protocol.failures import oom_kills, write_seen
from ..protocol.rundir import NODE_ENV, RunDir, read_json
from .runlog import last_record

log = logging.getLogger(__name__)


def seen_of(failure: Any) -> dict[str, Any]:
    """torchrun's ProcessFailure as JSON: exit code, pid, its timestamp (whole seconds),
    and the error file's message where the rank wrote one (``@record``)."""
    data = getattr(failure, "error_file_data", None) or {}
    # torch fills a failure without an error file with {"message": "<NONE>"}.
    written = bool(data) and data.get("message") not in (None, "<NONE>")
    message = failure.message if written else None
    if isinstance(message, dict):
        message = message.get("message", str(message))
    return {"exitcode": int(failure.exitcode), "pid": int(failure.pid),
            "timestamp": float(failure.timestamp or 0), "message": message}


def job_step(run_dir: RunDir) -> int | None:
    """The step the job was in: the one after the last training step logged."""
    rec = last_record(run_dir.metrics_log, lambda r: "step" in r and not r.get("eval"))
    return int(rec["step"]) + 1 if rec is not None else None


class AttemptRecorder:
    """Writes ``failures/attempt-<n>/torchrun.json`` when an attempt fails."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.oom_at_start = oom_kills()
        self.last_failed: int | None = None  # the attempt number of the newest failure

    def oom_killed(self) -> bool:
        now = oom_kills()
        return now is not None and self.oom_at_start is not None and now > self.oom_at_start

    def record(self, attempt: int, failures: dict[int, Any]) -> None:
        node = os.environ.get(NODE_ENV)
        if node:  # on several nodes the agents' counts differ: rank 0's is the job's
            attempt = int((read_json(self.run_dir.path / "attempt.json") or {}).get(
                "attempt", attempt))
        self.last_failed = attempt
        try:
            write_seen(self.run_dir, attempt, {int(r): seen_of(f) for r, f in failures.items()},
                       job_step(self.run_dir), self.oom_killed(), node)
        except OSError as exc:  # the restart must not fail for want of a record
            log.warning("hpinteract: could not record attempt %d's failures: %s", attempt, exc)

    def install(self) -> None:
        try:
            from torch.distributed.elastic.agent.server.local_elastic_agent import (
                LocalElasticAgent,
            )
        except ImportError:  # pragma: no cover - every torch with torchrun has it
            return
        original = getattr(LocalElasticAgent, "_monitor_workers", None)
        if original is None or getattr(original, "_hpinteract", False):
            return
        recorder = self

        def monitor(agent: Any, group: Any) -> Any:
            result = original(agent, group)
            if result.state.name in ("FAILED", "UNHEALTHY") and result.failures:
                spec = group.spec
                recorder.record(spec.max_restarts - agent._remaining_restarts,
                                result.failures)
            return result

        monitor._hpinteract = True  # type: ignore[attr-defined]
        LocalElasticAgent._monitor_workers = monitor
