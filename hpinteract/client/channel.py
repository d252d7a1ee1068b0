"""A Job's way to its coordinator: the shared query socket, a pool of command sockets, and
following a restarted job to its new coordinator.

Runs in: client processes (inside ``Job``). Queries share one client under a lock (ZeroMQ
sockets are not thread-safe, and a widget callback and a policy thread may both ask);
commands, which wait for a step boundary, each take a socket of their own from a pool and
give it back when answered. The pool is what keeps a busy client cheap for the job: a
socket per command would cost a TCP connection and a ZeroMQ handshake (and a teardown) in
the job's I/O thread for every ``set()``, on the cores the training shares. A reused socket
is safe: a client ignores replies to other request ids, and one that timed out is replaced
by a fresh socket before it is used again. A job that torchrun restarted writes a new
connection file (new ports, new key): the shared client and the pooled ones are replaced
when the file changes, and a query that timed out against the dead coordinator is asked
again of the new one.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import zmq

from ..protocol.connection import ConnectionInfo, connection_stamp
from ..protocol.errors import HpiTimeout, InvalidState, JobFailed
from ..protocol.messages import new_id
from ..protocol.states import JobState
from ..transport.control import ControlClient, result_of

if TYPE_CHECKING:
    from .job import Job

# Commands are answered once applied at a step boundary; a slow step delays that, so they
# wait longer than queries. Retries carry the same request id: the job never acts twice.
COMMAND_TIMEOUT_S, COMMAND_RETRIES = 10.0, 11
# A query (status, history, policies) is asked once per coordinator: it is not always
# idempotent (add_policy), so it is not sent again to the same one.
QUERY_TIMEOUT_S = 40.0
# Idle sockets kept for reuse: as many as a client commonly has commands in flight
# (a notebook one, a policy thread or a widget a few more); the rest are closed when done.
POOL_SIZE = 8
Stamp = tuple[int, int] | None


class Channel:
    def __init__(self, job: Job) -> None:
        self.job = job
        self._idle: list[tuple[ControlClient, Stamp]] = []  # idle sockets, under _pool_lock
        self._pool_lock = threading.Lock()

    def open(self, timeout: float) -> tuple[ControlClient, ConnectionInfo, Stamp]:
        """A client of the job's coordinator, its connection info and which file that was."""
        path = self.job.run_dir.connection
        deadline = time.monotonic() + timeout
        while not path.exists():
            state = self.job.state
            if state.terminal:
                self.raise_ended(state)
            if time.monotonic() > deadline:
                raise HpiTimeout(f"job {self.job.id} did not open its control port in "
                                 f"{timeout}s")
            time.sleep(0.05)
        stamp = connection_stamp(path)
        info = ConnectionInfo.read(path)
        client = ControlClient(zmq.Context.instance(), info.control_url, info.key_bytes,
                               server_key=info.server_key)
        return client, info, stamp

    def raise_ended(self, state: JobState) -> None:
        job = self.job
        if state == JobState.FAILED:
            raise JobFailed(f"job {job.id} failed: {job.error}",
                            rank=job.error.rank if job.error else None)
        raise InvalidState(f"job {job.id} is {state.value}")

    def request(self, type_: str, content: dict[str, Any] | None = None,
                command: bool = False) -> dict[str, Any]:
        state = self.job.state
        if state.terminal:
            self.raise_ended(state)
        if command:
            return self._command(type_, content or {})
        return self._query(type_, content or {})

    def close(self) -> None:
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for client, _ in idle:
            client.close()

    def _query(self, type_: str, content: dict[str, Any]) -> dict[str, Any]:
        """A query, on a pooled socket: no lock is held across the network wait, so one
        slow answer holds up no other thread. While it waits, a job that ended, or whose
        connection file changed or went (a restart or resize under way), ends the wait at
        once: an ended job raises, and otherwise the query waits for the next connection
        file, as commands do, and asks the new coordinator."""
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        req_id = new_id()
        while True:
            client, stamp = self._take(max(0.0, deadline - time.monotonic()))

            def gone(stamp: Stamp = stamp) -> bool:
                return (connection_stamp(self.job.run_dir.connection) != stamp
                        or self.job.state.terminal)

            try:
                return client.request(type_, content, timeout_s=max(
                    0.1, deadline - time.monotonic()), retries=0, req_id=req_id, give_up=gone)
            except HpiTimeout:
                state = self.job.state
                if state.terminal:
                    self.raise_ended(state)
                if time.monotonic() >= deadline:
                    raise HpiTimeout(f"job {self.job.id} did not answer {type_!r} in "
                                     f"{QUERY_TIMEOUT_S:.0f}s") from None
            finally:
                self._give_back(client, stamp)

    def _command(self, type_: str, content: dict[str, Any]) -> dict[str, Any]:
        """A command gets a socket of its own (queries from other threads are not held up),
        and one that times out is withdrawn: a command that raised on the client never
        applies later."""
        client, stamp = self._take()
        req_id = new_id()
        try:
            try:
                return client.request(type_, content, timeout_s=COMMAND_TIMEOUT_S,
                                      retries=COMMAND_RETRIES, req_id=req_id)
            except HpiTimeout:
                r = client.request("cancel", {"req_id": req_id}, timeout_s=5.0, retries=1)
                if r.get("reply"):  # it applied just as we gave up
                    return result_of(r["reply"])
                if r.get("in_flight"):  # taken for this very boundary: the answer is coming
                    return client.request(type_, content, timeout_s=COMMAND_TIMEOUT_S,
                                          retries=1, req_id=req_id)
                raise HpiTimeout(f"job {self.job.id} reached no step boundary in "
                                 f"{COMMAND_TIMEOUT_S * (COMMAND_RETRIES + 1):.0f}s; the "
                                 f"{type_} was withdrawn and not applied") from None
        finally:
            self._give_back(client, stamp)

    def _take(self, wait_s: float = 120.0) -> tuple[ControlClient, Stamp]:
        """An idle socket to the current coordinator, or a new one (waiting up to ``wait_s``
        for a connection file)."""
        now = connection_stamp(self.job.run_dir.connection)
        stale: list[ControlClient] = []
        taken: tuple[ControlClient, Stamp] | None = None
        with self._pool_lock:
            while self._idle and taken is None:
                client, stamp = self._idle.pop()
                if stamp == now and now is not None:
                    taken = (client, stamp)
                else:  # a restarted job's old coordinator
                    stale.append(client)
        for client in stale:
            client.close()
        if taken is not None:
            return taken
        client, _, stamp = self.open(timeout=wait_s)
        return client, stamp

    def _give_back(self, client: ControlClient, stamp: Stamp) -> None:
        with self._pool_lock:
            if len(self._idle) < POOL_SIZE:
                self._idle.append((client, stamp))
                return
        client.close()
