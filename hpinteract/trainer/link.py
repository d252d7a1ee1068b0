"""Frames between rank 0 and its coordinator process: length-prefixed JSON on a socket pair.

Runs in: rank 0 (the link's two threads, control_process.py) and the coordinator process
(forked.py). The pair is made by ``socket.socketpair`` before the fork, so nothing else can
connect to it; still, what crosses is JSON, never pickle. A frame is a list of items, each
a list whose first element names it (``["metric", {...}]``).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_HEAD = struct.Struct(">I")
_CHUNK = 1 << 20
# Rank 0's sender hands what its training thread posted to the child this often (at once
# for what a client waits on): metrics ride along at 20 batches a second.
BATCH_S = 0.05


def encode(items: list[list[Any]]) -> bytes:
    body = json.dumps(items, separators=(",", ":"), default=_plain).encode()
    return _HEAD.pack(len(body)) + body


def _plain(value: Any) -> Any:
    # A metric record may hold a device scalar (record.scalar keeps it, so that the training
    # thread never waits for the device): it is read here, on the link's thread.
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"a {type(value).__name__} cannot cross to the coordinator process")


class Reader:
    """Reassembles the frames of one end of the pair."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def read(self) -> list[list[Any]] | None:
        """One ``recv`` (it blocks until data comes): the items of the frames now whole, in
        order, or None once the other end has closed."""
        data = self._sock.recv(_CHUNK)
        if not data:
            return None
        self._buf += data
        items: list[list[Any]] = []
        while len(self._buf) >= _HEAD.size:
            (length,) = _HEAD.unpack_from(self._buf)
            end = _HEAD.size + length
            if len(self._buf) < end:
                break
            items.extend(json.loads(bytes(self._buf[_HEAD.size:end])))
            del self._buf[:end]
        return items
