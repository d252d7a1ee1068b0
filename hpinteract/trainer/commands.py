"""Commands waiting for a step boundary, and small helpers of the coordinator's requests.

Runs in: rank 0's coordinator thread (and the training thread, which takes the commands).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..protocol.errors import InvalidCommand
from ..protocol.messages import Message


@dataclass
class Command:
    """A validated command waiting for the next step boundary."""

    op: str  # set | pause | resume | stop
    id: str
    source: str
    values: dict[str, Any] = field(default_factory=dict)
    req_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"op": self.op, "id": self.id, "source": self.source, "values": self.values}


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
