"""Control channel: the coordinator's ROUTER socket and the clients' DEALER sockets.

Runs in: rank 0's coordinator (ControlServer) and any client process
(ControlClient). Requests carry a request id; the client waits with a timeout and retries a
bounded number of times on a fresh socket (ZeroMQ's "lazy pirate" pattern). A retry is a new
message with the same request id, so the server can answer it without acting twice.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from ..protocol.codec import MAX_MESSAGE_BYTES, Codec
from ..protocol.errors import AuthError, HpiError, HpiTimeout, ProtocolError, error_from_wire
from ..protocol.messages import REPLY, Message, make_message, new_id
from .curve import ServerKeys, secure_client, secure_server

log = logging.getLogger(__name__)


def bind_random_port(sock: zmq.Socket[Any], ip: str = "127.0.0.1") -> int:
    """Bind to a free port on ``ip``: loopback unless the job was told otherwise."""
    if not ipaddress.ip_address(ip).is_loopback:
        # Remote use is explicit (hpi.init(ip=...)): encrypted with CURVE (see curve.py), and
        # still worth a line in the log, since the port is reachable from elsewhere.
        log.warning("hpinteract: binding control sockets to non-loopback address %s", ip)
    port: int = sock.bind_to_random_port(f"tcp://{ip}")
    return port


_SNDMORE = int(zmq.SNDMORE)


class Rejected(Exception):
    """A request that failed verification; ``identity`` lets the server answer it."""

    def __init__(self, identity: list[bytes], error: AuthError | ProtocolError,
                 req_id: str | None = None) -> None:
        super().__init__(str(error))
        self.identity = identity
        self.error = error
        self.req_id = req_id  # of a message whose signature was good, when its header says

    @property
    def signed(self) -> bool:
        """Its sender holds the key (malformed, stale, replayed): worth an answer always;
        an unsigned or forged one is answered only while not a flood."""
        return isinstance(self.error, ProtocolError) or getattr(self.error, "signed", False)


class ControlServer:
    """The ROUTER end. ``recv`` returns verified requests; rejected ones are reported."""

    def __init__(self, ctx: zmq.Context[Any], key: bytes, ip: str = "127.0.0.1",
                 curve: ServerKeys | None = None) -> None:
        self.codec = Codec(key)
        self.socket = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.socket.setsockopt(zmq.LINGER, 500)
        secure_server(self.socket, curve)
        self.port = bind_random_port(self.socket, ip)
        self.session = new_id()

    def recv(self) -> tuple[list[bytes], Message]:
        """One verified request; raises Rejected for anything unsigned, forged or replayed."""
        frames = self.socket.recv_multipart(copy=True)
        identity = frames[:1]
        try:
            _, msg = self.codec.unpack(frames[1:])
        except (AuthError, ProtocolError) as exc:
            rejected = Rejected(identity, exc)
            if rejected.signed:
                rejected.req_id = _req_id_of(frames)
            raise rejected from exc
        return identity, msg

    def reply(self, identity: list[bytes], req: Message | None, content: dict[str, Any],
              req_id: str | None = None) -> None:
        req_id = req.header.req_id if req is not None else req_id
        msg = make_message(REPLY, content, session=self.session, req_id=req_id)
        # Frame by frame with a plain int flag: pyzmq's send_multipart costs twice as much
        # in Python (an enum operation per frame), and this is rank 0's cost per change.
        *frames, last = [*identity, *self.codec.pack(msg)]
        for frame in frames:
            self.socket.send(frame, _SNDMORE)
        self.socket.send(last)

    def close(self) -> None:
        self.socket.close()


def _req_id_of(frames: list[bytes]) -> str | None:
    """The request id in a signed but rejected message's header (JSON only), if any."""
    try:
        header = json.loads(frames[-2])
        req_id = header.get("req_id") if isinstance(header, dict) else None
    except (ValueError, IndexError):
        return None
    return req_id if isinstance(req_id, str) and len(req_id) <= 64 else None


class ControlClient:
    """The DEALER end: ``request`` returns the reply's content or raises the job's error."""

    def __init__(
        self, ctx: zmq.Context[Any], url: str, key: bytes, *, timeout_s: float = 10.0,
        retries: int = 3, server_key: bytes | None = None,
    ) -> None:
        self._ctx = ctx
        self._server_key = server_key  # CURVE: the job's public key, when it uses CURVE
        self._url = url
        self.codec = Codec(key)
        self.session = new_id()
        self.timeout_s = timeout_s
        self.retries = retries
        self._sock: zmq.Socket[Any] | None = None

    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            secure_client(sock, self._server_key)
            sock.connect(self._url)
            self._sock = sock
        return self._sock

    def _reset(self) -> None:
        # A DEALER that timed out may still get the late reply; a fresh socket cannot.
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def request(
        self, type_: str, content: dict[str, Any] | None = None, *,
        timeout_s: float | None = None, retries: int | None = None, req_id: str | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """``give_up`` is asked every quarter second while the answer is awaited: true ends
        the wait at once with HpiTimeout (the caller knows the server has gone)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        attempts = 1 + (self.retries if retries is None else retries)
        req_id = req_id or new_id()
        for _ in range(attempts):
            msg = make_message(type_, content or {}, session=self.session, req_id=req_id)
            sock = self._socket()
            sock.send_multipart(self.codec.pack(msg))
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(int(min(left, 0.25 if give_up else left) * 1000) + 1):
                    if give_up is not None and give_up():
                        self._reset()
                        raise HpiTimeout(f"gave up waiting for {type_!r} from {self._url}")
                    continue
                frames = sock.recv_multipart()
                try:
                    _, reply = self.codec.unpack(frames)
                except HpiError as exc:
                    log.warning("dropped a reply that failed verification: %s", exc)
                    continue
                if reply.header.req_id != req_id:
                    continue  # a late answer to an earlier request
                return result_of(reply.content)
            self._reset()
        raise HpiTimeout(
            f"no reply to {type_!r} from {self._url} after {attempts} tries of {timeout:g}s"
        )

    def close(self) -> None:
        self._reset()


def result_of(content: dict[str, Any]) -> dict[str, Any]:
    if content.get("ok", False):
        return content
    err = content.get("error")
    raise error_from_wire(err if isinstance(err, dict) else {"message": str(err)})
