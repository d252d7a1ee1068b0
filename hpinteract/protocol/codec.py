"""Signing and verification of messages (HMAC-SHA256), with replay protection.

Runs in: every process that speaks the protocol. Frames on the wire are

    [routing frames...] DELIM signature header content

where ``signature`` is the hex HMAC-SHA256 of ``header`` and ``content`` (and the topic,
for PUB messages) under the job's key. The signature is checked with a constant-time
compare *before* any byte is decoded, so unsigned or forged data is never parsed; then the
message id is checked against the ids already seen and the header time against a window,
so a captured message cannot be replayed. JSON only: nothing is unpickled or evaluated.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .errors import AuthError, ProtocolError
from .messages import PROTOCOL_VERSION, Header, Message

DELIM = b"<HPI|MSG>"
# Largest message a peer accepts; bigger frames are dropped unread (memory DoS guard).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def _dumps(obj: Any) -> bytes:
    # allow_nan stays on: a diverged loss (NaN) is a metric worth seeing. Commands carrying
    # NaN are rejected by hyper-parameter validation, with a message that says so.
    return json.dumps(obj, separators=(",", ":")).encode()


class Codec:
    """Packs and unpacks signed messages for one key.

    Each receiving socket owns one Codec so that its replay memory covers what it has seen.
    """

    def __init__(
        self, key: bytes, *, replay_window_s: float = 300.0, max_remembered: int = 200_000
    ) -> None:
        if len(key) < 16:
            raise AuthError("the signing key must be at least 16 bytes")
        self._key = key
        self._window = replay_window_s
        self._max = max_remembered
        self._seen: OrderedDict[str, float] = OrderedDict()

    def sign(self, parts: Sequence[bytes]) -> bytes:
        # One-shot HMAC over the parts joined (the same MAC as updating part by part): no
        # HMAC object per message, which was most of the cost of signing.
        return hmac.digest(self._key, b"".join(parts), hashlib.sha256).hex().encode()

    def pack(self, msg: Message, *, topic: bytes | None = None) -> list[bytes]:
        header = _dumps(msg.header.to_dict())
        content = _dumps(msg.content)
        signed = [header, content] if topic is None else [topic, header, content]
        frames = [] if topic is None else [topic]
        return [*frames, DELIM, self.sign(signed), header, content]

    def unpack(
        self, frames: Sequence[bytes], *, topic: bool = False
    ) -> tuple[list[bytes], Message]:
        """Verify and decode; returns (routing frames before the delimiter, message).

        Raises AuthError for anything unsigned, forged, replayed or stale, and ProtocolError
        for signed but malformed messages.
        """
        try:
            i = list(frames).index(DELIM)
        except ValueError:
            raise AuthError("unsigned message (no signature delimiter)") from None
        prefix = list(frames[:i])
        rest = frames[i + 1 :]
        if len(rest) != 3:
            raise AuthError("malformed signed message (expected signature, header, content)")
        signature, header_b, content_b = rest
        if len(header_b) + len(content_b) > MAX_MESSAGE_BYTES:
            raise AuthError("message too large")
        if topic and not prefix:
            raise AuthError("published message without topic")
        signed = [header_b, content_b] if not topic else [prefix[-1], header_b, content_b]
        if not hmac.compare_digest(self.sign(signed), bytes(signature)):
            raise AuthError("bad signature")
        try:
            h = json.loads(header_b)
            content = json.loads(content_b)
            header = Header(
                msg_id=str(h["msg_id"]),
                type=str(h["type"]),
                session=str(h["session"]),
                time=float(h["time"]),
                version=str(h["version"]),
                req_id=None if h.get("req_id") is None else str(h["req_id"]),
            )
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            # RecursionError: JSON nested deeper than the parser goes.
            raise ProtocolError(f"malformed message: {type(exc).__name__}: "
                                f"{str(exc)[:200]}") from None
        if not isinstance(content, dict):
            raise ProtocolError("message content must be a JSON object")
        if header.version.split(".")[0] != PROTOCOL_VERSION.split(".")[0]:
            raise ProtocolError(
                f"protocol version {header.version} is not compatible with {PROTOCOL_VERSION}"
            )
        self._check_replay(header)
        return prefix, Message(header, content)

    def _check_replay(self, header: Header) -> None:
        now = time.time()
        if not math.isfinite(header.time) or abs(now - header.time) > self._window:
            raise AuthError(f"stale message (sent {now - header.time:.0f}s ago)", signed=True)
        if header.msg_id in self._seen:
            raise AuthError(f"replayed message {header.msg_id}", signed=True)
        self._seen[header.msg_id] = header.time
        # Ids older than the window can go: their messages would be rejected as stale.
        while self._seen and (
            len(self._seen) > self._max or now - next(iter(self._seen.values())) > self._window
        ):
            self._seen.popitem(last=False)
