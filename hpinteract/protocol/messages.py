"""Message and header types of the control and metrics protocol.

Runs in: every process. A message is a header (id, type, session, time, protocol version,
optional request id) and a JSON content dict; `codec` turns it into signed frames.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = "1.0"

REPLY = "reply"
# The PUB socket's one topic: a batch of records (metrics and events, in seq order) per
# coordinator cycle. One message per cycle, not per step, keeps the cost off the ranks' CPUs.
TOPIC_RECORDS = b"records"


def new_id() -> str:
    """128 random bits as 32 hex digits (the format of ``uuid4().hex``, without building a
    UUID: several ids are made per change; nothing reads them as UUIDs)."""
    return os.urandom(16).hex()


@dataclass(frozen=True)
class Header:
    msg_id: str
    type: str
    session: str
    time: float
    version: str = PROTOCOL_VERSION
    req_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "msg_id": self.msg_id,
            "type": self.type,
            "session": self.session,
            "time": self.time,
            "version": self.version,
        }
        if self.req_id is not None:
            d["req_id"] = self.req_id
        return d


@dataclass(frozen=True)
class Message:
    header: Header
    content: dict[str, Any] = field(default_factory=dict)

    @property
    def type(self) -> str:
        return self.header.type


def make_message(
    type_: str, content: dict[str, Any], *, session: str, req_id: str | None = None
) -> Message:
    """A fresh message: every call gets a new id, so a resend is never a replay."""
    return Message(Header(new_id(), type_, session, time.time(), req_id=req_id), content)
