"""A job's recorded hyper-parameter changes, read back from its events: what a replay
applies again, and what a resumed or restarted job re-applies after its checkpoint.

Runs in: client processes (``hpi.launch(replay=...)``) and rank 0 of a resumed job. Pure:
it takes the events (dicts, in log order) and reads no file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


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
