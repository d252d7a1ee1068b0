"""The coordinator in a process of its own: rank 0's side of it.

Runs in: rank 0, on its training thread (``post``, ``take_pending``, ``close``: the same
calls as the coordinator thread's) and in two threads of the link: one sends what the
training thread posted, the other receives the commands. The coordinator itself (sockets,
logs, requests, policies) runs in a child forked from rank 0 when the run starts
(forked.py), so that its Python never holds the interpreter lock rank 0's training thread
needs: every other rank waits for rank 0 at each all-reduce, and on a 2-core machine under
100 changes a second that lock cost training about 1 % per 0.1 ms of the coordinator's
work per change (docs/RELIABILITY.md, load).

What stays here, because it belongs to the training process: the checkpoint writer (the
captured tensors never cross; the child sends the policies' state and the change history
that complete them) and the reading of device scalars (on the sending thread, off the
training loop). It is opt-in on Linux (``HPINTERACT_COORDINATOR=process``); the default
keeps the coordinator a thread of rank 0, and a child that does not start falls back to
that thread.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..protocol import settings
from ..protocol.rundir import RunDir
from ..protocol.states import JobState
from .checkpoint import CheckpointWriter
from .commands import Command
from .coordinator import PERIODIC_SOURCE, Coordinator
from .forked import serve as serve_forked
from .link import BATCH_S, Reader, encode
from .store import HParamStore
from .stuck import describe, dumpable_child, no_collection_across_fork

log = logging.getLogger(__name__)

Facts = Callable[[], dict[str, Any]]  # what validation reads of rank 0 besides its values
_STATUS_KINDS = ("status", "state")  # after these, rank 0 sends its facts again
START_S = 30.0  # how long rank 0 waits for the child's "ready"


class ControlPlane(Protocol):
    """What rank 0's training thread calls, a thread or a process behind it."""

    command_ready: threading.Event

    def start(self) -> Any: ...
    def post(self, *item: Any, wake: bool = True) -> None: ...
    def take_pending(self) -> list[Command]: ...
    def close(self, state: JobState, error: dict[str, Any] | None = None) -> None: ...


def process_wanted() -> bool:
    """Whether rank 0 forks its coordinator (``HPINTERACT_COORDINATOR=process``, opt-in).

    Not the default: one start in a few hundred hangs before the child has armed its own
    traceback timer (seen in the full suite twice, not understood; it then falls back to
    the thread after START_S, and says what the child was doing: stuck.py). Linux only:
    fork is what DataLoader workers use there too, from processes that hold CUDA and NCCL
    state (the child never touches them; not yet run on a GPU), while on macOS a fork of
    a threaded process is unsafe. A wrong value is a ConfigError (protocol/settings.py).
    """
    settings.coordinator_nice(os.environ)  # checked here, before the fork: the child reads it
    mode = settings.coordinator_mode(os.environ)
    return mode == "process" and sys.platform.startswith("linux") and hasattr(os, "fork")


def control_plane(run_dir: RunDir, *, store: HParamStore, world_size: int, ip: str,
                  policies: list[Any], resumed: dict[str, Any] | None,
                  facts: Facts) -> ControlPlane:
    """Rank 0's coordinator, started: a process of its own, or a thread (``process_wanted``,
    or a process that did not start)."""
    if not process_wanted():
        coord = Coordinator(run_dir, validate=store.validate, world_size=world_size, ip=ip,
                            policies=policies, resumed=resumed)
        coord.start()
        return coord

    known = facts()  # read here: the child runs as little of rank 0's code as it can

    def serve(sock: socket.socket, parent: int) -> int:  # in the child, just forked
        return serve_forked(sock, parent, store=store, facts=known, run_dir=run_dir,
                            world_size=world_size, ip=ip, policies=policies, resumed=resumed)

    plane = ControlProcess(run_dir.checkpoints_dir, serve, facts)
    try:
        plane.start()
        return plane
    except RuntimeError as exc:
        # The job must not fail for where its control plane runs: the thread serves the
        # same, and the events log and the rank's log say why it is the thread.
        why = f"{exc}; the coordinator runs as a thread of rank 0 instead"
        log.warning("hpinteract: %s", why)
    coord = Coordinator(run_dir, validate=store.validate, world_size=world_size, ip=ip,
                        policies=policies, resumed=resumed)
    coord.start()
    coord.post("event", {"kind": "coordinator", "mode": "thread", "source": "job",
                         "error": why})
    return coord


class ControlProcess:
    def __init__(self, checkpoints: Path, serve: Callable[[socket.socket, int], int],
                 facts: Facts) -> None:
        """``serve(sock, parent_pid)`` runs the coordinator in the child and returns its
        exit status (forked.py); ``facts`` is read on the link's thread; checkpoints are
        written into ``checkpoints``."""
        self._checkpoints = checkpoints
        self._serve = serve
        self._facts = facts
        self.pending: collections.deque[Command] = collections.deque()
        self.command_ready = threading.Event()
        self._lock = threading.Lock()  # pending: the training thread and the receiver
        self._outbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._kick = threading.Event()
        self._captured: dict[str, tuple[Command, dict[str, Any]]] = {}  # awaiting extras
        self._writer: CheckpointWriter | None = None
        self._pid = 0
        self._closing = False  # the sender is ending the job: the child's exit is expected
        self._gone = threading.Event()  # the child closed its end (exited or crashed)

    # ---- the training thread --------------------------------------------------------------
    def start(self) -> None:
        ours, theirs = socket.socketpair()
        with dumpable_child(), no_collection_across_fork():
            pid = os.fork()
        if pid == 0:  # the child: never returns into the training script
            code = 70
            try:
                ours.close()
                code = self._serve(theirs, os.getppid())
            except BaseException:
                log.exception("hpinteract coordinator process failed")
            finally:
                os._exit(code)
        theirs.close()
        self._pid, self._sock, self._reader = pid, ours, Reader(ours)
        first = self._first_item(START_S)
        if first is None or first[0] != "ready":
            why = first[1] if first is not None and first[0] == "failed" else \
                f"it exited or did not report ready within {START_S:g} s"
            if first is None and self._alive():  # stuck: say where (its stacks: the log)
                why += f" (its threads: {describe(pid)})"
            self._reap(5)
            raise RuntimeError(f"coordinator process failed to start: {why}")
        self._sender = threading.Thread(target=self._send_loop, name="hpi-link-out",
                                        daemon=True)
        self._receiver = threading.Thread(target=self._recv_loop, name="hpi-link-in",
                                          daemon=True)
        self._sender.start()
        self._receiver.start()

    def _first_item(self, timeout: float) -> list[Any] | None:
        """The child's first item ("ready" or "failed"); None if it ended or stayed silent.
        The child sends nothing else before it, so nothing read here is lost."""
        self._sock.settimeout(timeout)
        try:
            while not (items := self._reader.read()):
                if items is None:
                    return None
            return items[0]
        except TimeoutError:
            return None
        finally:
            self._sock.settimeout(None)

    def post(self, *item: Any, wake: bool = True) -> None:
        self._outbox.put(item)
        if wake:
            self._kick.set()

    def take_pending(self) -> list[Command]:
        if not self.pending:  # the usual case: no lock on the hot path
            return []
        with self._lock:
            out = list(self.pending)
            self.pending.clear()
            self.command_ready.clear()
        return out

    def close(self, state: JobState, error: dict[str, Any] | None = None) -> None:
        self.post("close", state, error)
        # The sender first lets the writer finish what was captured (as the coordinator
        # thread does), then waits for the child's end state.
        self._sender.join(150)

    # ---- the link's threads ---------------------------------------------------------------
    def _send_loop(self) -> None:
        closing: tuple[Any, ...] | None = None
        while closing is None:
            self._kick.wait(BATCH_S)
            self._kick.clear()
            items, closing = self._collect()
            if not self._send(items):
                return
        if self._gone.is_set():
            return
        deadline = time.monotonic() + 30  # extras for the last checkpoints, from the child
        while self._captured and not self._gone.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._writer is not None:
            self._writer.close()
        self._closing = True
        self._send([*self._written(), ["close", closing[1].value, closing[2]]])
        self._reap(10)

    def _collect(self) -> tuple[list[list[Any]], tuple[Any, ...] | None]:
        items: list[list[Any]] = []
        facts = False
        while True:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                break
            kind = item[0]
            if kind == "close":
                items.extend(self._written())
                return items + ([["facts", self._facts()]] if facts else []), item
            if kind in ("applied", "checkpoint"):
                cmd: Command = item[1]
                if kind == "checkpoint":
                    self._captured[cmd.id] = (cmd, item[2])
                    items.append(["checkpoint", cmd.to_json()])
                else:
                    items.append(["applied", cmd.to_json(), item[2]])
            elif kind == "state":
                items.append(["state", item[1].value, item[2], item[3]])
            elif kind == "written":  # a framework's checkpoint (integrations): on disk
                w = item[1]
                items.append(["written", w.token.to_json(), w.step,
                              None if w.path is None else str(w.path), w.error, w.seconds,
                              w.size])
            else:  # metric, status, event, cancelled: JSON as they are
                items.append(list(item))
            facts = facts or kind in _STATUS_KINDS
        if facts:
            items.append(["facts", self._facts()])
        items.extend(self._written())
        return items, None

    def _written(self) -> list[list[Any]]:
        if self._writer is None:
            return []
        return [["written", w.token.to_json(), w.step, None if w.path is None else str(w.path),
                 w.error, w.seconds, w.size] for w in self._writer.finished()]

    def _send(self, items: list[list[Any]]) -> bool:
        if not items:
            return True
        try:
            self._sock.sendall(encode(items))
        except OSError:  # the child is gone: the receiver says so
            return False
        return True

    def _recv_loop(self) -> None:
        while True:
            try:
                items = self._reader.read()
            except OSError:
                items = None
            if items is None:
                break
            for item in items:
                self._received(item)
        self._gone.set()
        if not self._closing:
            log.error("hpinteract: the coordinator process ended; the job trains on "
                      "without its control plane")

    def _received(self, item: list[Any]) -> None:
        kind = item[0]
        if kind == "command":
            with self._lock:
                self.pending.append(Command.from_json(item[1]))
                self.command_ready.set()
        elif kind == "cancel":  # withdrawn if the training thread has not taken it yet
            with self._lock:
                found = [c for c in self.pending if c.id == item[1]]
                for c in found:
                    self.pending.remove(c)
            self.post("cancelled", item[1], bool(found))
        elif kind == "extras":
            cmd, state = self._captured[item[1]]
            state.update(item[2])
            if self._writer is None:
                self._writer = CheckpointWriter(self._checkpoints, wake=self._kick.set)
            self._writer.submit(state, cmd, periodic=cmd.source == PERIODIC_SOURCE)
            del self._captured[item[1]]

    def _alive(self) -> bool:
        try:
            pid, _ = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return pid == 0

    def _reap(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._alive():
                return
            time.sleep(0.01)
        log.error("hpinteract: the coordinator process did not end; killing it")
        os.kill(self._pid, signal.SIGKILL)
        os.waitpid(self._pid, 0)

