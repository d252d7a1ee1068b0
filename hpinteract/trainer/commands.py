"""Commands waiting for a step boundary, and small helpers of the coordinator's requests.

Runs in: rank 0's coordinator (and the training thread, which takes the commands).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..protocol.errors import InvalidCommand
from ..protocol.messages import Message


@dataclass
class Command:
    """A validated command waiting for the next step boundary."""

    op: str  # set | pause | resume | stop, and from policies: rollback | guard
    id: str
    source: str
    values: dict[str, Any] = field(default_factory=dict)
    req_id: str | None = None
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # an op's own arguments
    # False for commands made on rank 0's training thread (lr_scaling): the coordinator did
    # not count them among those it queued.
    tracked: bool = True
    # Once applied (rank 0): the values the set replaced, for the events log ("from what").
    previous: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        wire = {"op": self.op, "id": self.id, "source": self.source, "values": self.values}
        if self.extra:
            wire["extra"] = self.extra
        return wire

    def to_json(self) -> dict[str, Any]:
        """Every field, for the link between rank 0 and a coordinator process of its own."""
        return {"op": self.op, "id": self.id, "source": self.source, "values": self.values,
                "req_id": self.req_id, "reason": self.reason, "extra": self.extra,
                "tracked": self.tracked, "previous": self.previous}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Command:
        return cls(str(data["op"]), str(data["id"]), str(data["source"]),
                   dict(data["values"]), data["req_id"], str(data["reason"]),
                   dict(data["extra"]), bool(data["tracked"]), dict(data["previous"]))


Send = Callable[[list[bytes], Message, dict[str, Any]], None]


class Replies:
    """Commands are answered once applied: who waits for which request id, and the answers
    kept (the newest ``keep``), so that a retry with the same id is answered again and
    never acted on twice."""

    def __init__(self, send: Send, keep: int = 1000) -> None:
        self._send = send
        self._keep = keep
        self.waiting: dict[str, tuple[list[bytes], Message]] = {}  # req_id -> requester
        self.done: OrderedDict[str, dict[str, Any]] = OrderedDict()  # req_id -> reply

    def retry(self, identity: list[bytes], msg: Message) -> bool:
        """True if ``msg`` repeats a request already answered (answered again) or queued
        (the new requester waits for it instead)."""
        req_id = msg.header.req_id
        if req_id is not None and req_id in self.done:
            self._send(identity, msg, self.done[req_id])
            return True
        if req_id is not None and req_id in self.waiting:
            self.waiting[req_id] = (identity, msg)
            return True
        return False

    def wait(self, req_id: str, identity: list[bytes], msg: Message) -> None:
        self.waiting[req_id] = (identity, msg)

    def finish(self, req_id: str | None, reply: dict[str, Any]) -> None:
        if req_id is None:
            return
        waiting = self.waiting.pop(req_id, None)
        self.done[req_id] = reply
        while len(self.done) > self._keep:
            self.done.popitem(last=False)
        if waiting is not None:
            self._send(waiting[0], waiting[1], reply)


class RateLimit:
    """At most ``per_minute`` events a minute; the rest are only counted."""

    def __init__(self, per_minute: int) -> None:
        self._per_minute = per_minute
        self._window = 0.0
        self._used = 0
        self._dropped = 0

    def allow(self) -> bool:
        now = time.monotonic()
        if now - self._window > 60.0:
            self._window, self._used = now, 0
        self._used += 1
        if self._used > self._per_minute:
            self._dropped += 1
            return False
        return True

    def suppressed(self) -> dict[str, int]:
        dropped, self._dropped = self._dropped, 0
        return {"suppressed_before": dropped} if dropped else {}


def int_field(content: dict[str, Any], key: str, default: int) -> int:
    value = content.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidCommand(f"{key!r} must be an integer, got {value!r}")
    return value


def source_of(msg: Message) -> str:
    src = msg.content.get("source", "api")
    return str(src)[:64] if src else "api"


def reason_of(content: dict[str, Any]) -> str:
    reason = content.get("reason", "")
    return str(reason)[:500] if reason else ""


NOTE_STATUSES = ("decided", "failed", "suspended", "enabled", "rejected", "added", "removed",
                 "disabled")


def note_of(content: dict[str, Any]) -> dict[str, Any]:
    """A client policy's notice, checked field by field: only short strings are kept."""
    status = content.get("status")
    if status not in NOTE_STATUSES:
        raise InvalidCommand(f"a note's status must be one of {list(NOTE_STATUSES)}, "
                             f"got {status!r}")
    note: dict[str, Any] = {"kind": "policy", "where": "client", "status": status}
    for key, limit in (("policy", 64), ("reason", 500), ("error", 8000)):
        value = content.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise InvalidCommand(f"a note's {key!r} must be a string")
            note[key] = value[:limit]
    step = content.get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        note["step"] = step
    return note
