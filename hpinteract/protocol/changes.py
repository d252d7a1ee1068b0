"""A job's recorded hyper-parameter changes, read back from its events: what a replay
applies again, and what a resumed or restarted job re-applies after its checkpoint.

Runs in: client processes (``hpi.launch(replay=...)``) and rank 0 of a resumed job. Pure:
it takes the events (dicts, in log order) and reads no file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Applied:
    """One applied change as every view tells it (the dashboard's marker, the terminal's
    line, the TensorBoard text): what changed from what to what, where, by whom, why."""

    step: int
    source: str
    values: dict[str, Any]
    previous: dict[str, Any]  # the values replaced, where rank 0 recorded them
    reason: str | None

    @classmethod
    def of(cls, ev: dict[str, Any]) -> Applied | None:
        """The change an event records, or None for any other event (or one refused)."""
        if ev.get("kind") != "change" or ev.get("status") != "applied":
            return None
        values, prev = ev.get("values"), ev.get("previous")
        return cls(int(ev.get("applied_at_step") or 0), str(ev.get("source") or "?"),
                   values if isinstance(values, dict) else {},
                   prev if isinstance(prev, dict) else {},
                   str(ev["reason"]) if ev.get("reason") else None)


def recorded_changes(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The applied changes in effect order, each ``{"step", "values", "source", "id"}``
    (the step where it took effect), and ``stop_at``, the step where the job was stopped.

    Changes that a resume or restart undid (applied at or after the checkpoint it went back
    to, before it) are left out, as the job no longer had them; rollbacks restored a
    snapshot nobody else has, so their changes are listed apart (``rollbacks_skipped``).
    """
    changes: list[dict[str, Any]] = []
    rollbacks: set[str] = set()
    stop_at: int | None = None
    for ev in events:
        kind = ev.get("kind")
        if kind in ("resume", "restart"):
            back = int(ev.get("step", 0))
            changes = [c for c in changes if c["step"] < back]
            if stop_at is not None and stop_at >= back:
                stop_at = None
        elif kind == "rollback":
            rollbacks.add(str(ev.get("id")))
        elif kind == "change" and ev.get("status") == "applied" and ev.get("values"):
            changes.append({"step": int(ev["applied_at_step"]), "values": ev["values"],
                            "source": str(ev.get("source", "api")), "id": str(ev["id"])})
        elif kind == "state" and ev.get("state") == "stopping":
            stop_at = int(ev.get("step", 0))
    return {"changes": [c for c in changes if c["id"] not in rollbacks], "stop_at": stop_at,
            "rollbacks_skipped": [c["step"] for c in changes if c["id"] in rollbacks]}


def to_redo(events: Iterable[dict[str, Any]], step: int, saved_ids: set[str],
            overridden: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The changes a job resumed from its checkpoint at ``step`` makes again at their
    steps: those that took effect at or after it and are not in the checkpoint
    (``saved_ids``); names given anew at the resume (``overridden``) are left to those."""
    skip = set(overridden)
    out = []
    for c in recorded_changes(events)["changes"]:
        if c["step"] < step or c["id"] in saved_ids:
            continue
        values = {n: v for n, v in c["values"].items() if n not in skip}
        if values:
            out.append({**c, "values": values})
    return out
