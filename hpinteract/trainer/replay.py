"""Replaying another job's recorded changes at the steps where they took effect.

Runs in: every rank's training thread. ``hpi.launch(replay=job)`` puts the schedule in the
new job's spec (client/lineage.py: ``replay_plan``); every rank reads the same file, so
each applies entry k at the same step without a collective, exactly where a sync point
applied it the first time (after the step counter moved on, before the next step runs).
Values are applied as recorded, lr scaling's own entries included, so nothing is derived
twice; the job's in-job policies are not started, their decisions being in the schedule.
"""

from __future__ import annotations

import math
from typing import Any

from ..protocol.messages import new_id


class ReplaySchedule:
    """``plan``: ``{"of", "changes", "stop_at"}``. ``start``: a resumed run's first step;
    entries before it are in its checkpoint already. ``redo``: the changes a resumed or
    restarted job makes again after its checkpoint (source ``reapplied:...``)."""

    def __init__(self, plan: dict[str, Any] | None, start: int = 0,
                 redo: list[dict[str, Any]] | None = None) -> None:
        plan = plan or {}
        self.of = plan.get("of")
        todo = [{"op": "set", "step": int(c["step"]), "values": dict(c["values"]),
                 "source": f"replay:{c.get('source', 'api')}", "of": c.get("id")}
                for c in plan.get("changes") or [] if not start or int(c["step"]) > start]
        todo += [{"op": "set", "step": int(c["step"]), "values": dict(c["values"]),
                  "source": f"reapplied:{c.get('source', 'api')}", "of": c.get("id")}
                 for c in redo or []]
        if plan.get("stop_at") is not None and int(plan["stop_at"]) > start:
            todo.append({"op": "stop", "step": int(plan["stop_at"]), "values": {},
                         "source": "replay", "of": None})
        # Stable: two changes of one step keep their recorded order, a stop comes last.
        self._todo = sorted(todo, key=lambda c: c["step"])
        self.count = len(self._todo)
        self.next_step: float = self._todo[0]["step"] if self._todo else math.inf

    def __bool__(self) -> bool:
        return self.of is not None

    def due(self, step: int) -> list[dict[str, Any]]:
        """The entries for steps up to ``step``, as wire commands, in order."""
        out = []
        while self._todo and self._todo[0]["step"] <= step:
            c = self._todo.pop(0)
            out.append({"op": c["op"], "id": new_id(), "source": c["source"],
                        "values": c["values"], "of": c["of"]})
        self.next_step = self._todo[0]["step"] if self._todo else math.inf
        return out
