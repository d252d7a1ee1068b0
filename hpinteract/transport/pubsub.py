"""Metrics and events stream: PUB on rank 0, SUB in clients, with ZeroMQ's clone pattern.

Runs in: rank 0's coordinator (Publisher) and client processes (Subscriber,
CatchUp). Every published record carries a sequence number shared by metrics and events.
A late joiner subscribes first, then pages the history in over the control channel, and
drops live records that are not newer than what the history gave it; a gap in the live
sequence (a slow subscriber's dropped messages) is filled from the history too, so the
consumer sees every record exactly once, in order.

Sequence numbers have lasting holes where a resumed or restarted job set aside the steps
run after its checkpoint (``metrics.superseded.jsonl``); a hole is waited on only while it
may still be a record not yet written, and skipped once the log is known to be complete
past it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from ..protocol.codec import MAX_MESSAGE_BYTES, Codec
from ..protocol.errors import HpiError
from ..protocol.messages import TOPIC_RECORDS, make_message, new_id
from .control import bind_random_port
from .curve import ServerKeys, secure_client, secure_server

log = logging.getLogger(__name__)

Record = dict[str, Any]
# history(since) -> (records with seq > since in order, more pages waiting, durable):
# every seq up to ``durable`` that the history lacks never will be (0: not known).
FetchHistory = Callable[[int], tuple[list[Record], bool, int]]


class Publisher:
    def __init__(self, ctx: zmq.Context[Any], key: bytes, ip: str = "127.0.0.1",
                 curve: ServerKeys | None = None) -> None:
        self.codec = Codec(key)
        self.socket = ctx.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 200)
        secure_server(self.socket, curve)
        self.port = bind_random_port(self.socket, ip)
        self.session = new_id()

    def publish(self, records: list[Record]) -> None:
        """One signed message carrying a batch of records, in seq order."""
        msg = make_message(TOPIC_RECORDS.decode(), {"records": records}, session=self.session)
        self.socket.send_multipart(self.codec.pack(msg, topic=TOPIC_RECORDS))

    def close(self) -> None:
        self.socket.close()


class Subscriber:
    def __init__(self, ctx: zmq.Context[Any], url: str, key: bytes,
                 server_key: bytes | None = None) -> None:
        self.codec = Codec(key)
        self.socket = ctx.socket(zmq.SUB)
        secure_client(self.socket, server_key)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.socket.setsockopt(zmq.RCVHWM, 100_000)
        self.socket.setsockopt(zmq.SUBSCRIBE, TOPIC_RECORDS)
        self.socket.connect(url)

    def recv(self, timeout_s: float) -> list[Record] | None:
        """The next verified batch of records, or None after ``timeout_s`` without one."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.socket.poll(int(left * 1000) + 1):
                return None
            frames = self.socket.recv_multipart()
            try:
                _, msg = self.codec.unpack(frames, topic=True)
            except HpiError as exc:
                log.warning("dropped a published message that failed verification: %s", exc)
                continue
            records = msg.content.get("records")
            if isinstance(records, list):
                return [r for r in records if isinstance(r, dict)]
        return None

    def close(self) -> None:
        self.socket.close()


class CatchUp:
    """Every record exactly once, in sequence order: the history first, then live ones."""

    def __init__(self, sub: Subscriber, fetch: FetchHistory, since: int = 0) -> None:
        self._sub = sub
        self._fetch = fetch
        self.last_seq = since

    def _backfill(self, durable: int = 0) -> Iterator[Record]:
        """History after ``last_seq``; ``durable``: as FetchHistory's, known otherwise."""
        more = True
        while more:
            records, more, known = self._fetch(self.last_seq)
            complete = max(durable, known)
            progressed = False
            for rec in records:
                seq = int(rec["seq"])
                if seq <= self.last_seq:
                    continue
                if seq != self.last_seq + 1 and seq > complete:
                    return  # a hole (a line not yet flushed): live records will fill it
                self.last_seq = seq
                progressed = True
                yield rec
            if not progressed:
                break

    def __call__(self, timeout_s: float = 1.0) -> Iterator[Record]:
        """History not yet seen, then live records until ``timeout_s`` passes without any."""
        yield from self._backfill()
        while True:
            batch = self._sub.recv(timeout_s)
            if batch is None:
                return
            for rec in batch:
                seq = int(rec.get("seq", 0))
                if seq <= self.last_seq:
                    continue  # already delivered by the history
                if seq > self.last_seq + 1:
                    # Missed some: the log has them. The job writes both logs before it
                    # publishes, so whatever older record the log lacks now never comes.
                    yield from self._backfill(durable=seq - 1)
                    if seq <= self.last_seq:
                        continue
                self.last_seq = seq
                yield rec
