"""The coordinator process: the child that rank 0 forks when its run starts.

Runs in: that child, in its only thread. It is the coordinator of coordinator.py (sockets,
logs, requests, policies), fed over the link (link.py) with what rank 0's training
thread posts, and handing its validated commands back the same way; control_process.py is
rank 0's side. It never touches torch: the checkpoints are written in rank 0, which asks
this process only for what it owns of them (the policies' state and the change history).

Validation runs on a copy of rank 0's store that follows rank 0's status (values and specs
after every applied change) and its facts (whether a resize or model averaging can be had
now), so that a change is judged against the job as it is, not as it was at the fork.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import zmq

from ..protocol import settings
from ..protocol.messages import Message
from ..protocol.states import JobState
from .checkpoint import Written
from .commands import Command
from .coordinator import Coordinator
from .declare import rules
from .link import BATCH_S, Reader, encode
from .store import Constraint, HParamStore

NAME = "hpi-coordinator"  # the process's name (ps, top, /proc/<pid>/comm)
LINGER_MS = 2000
START_DUMP_S = 20.0  # a start slower than this writes every thread's traceback to stderr


def serve(sock: socket.socket, parent: int, *, store: HParamStore, facts: dict[str, Any],
          **coordinator: Any) -> int:
    """Run the coordinator until rank 0 closes the job or dies; the exit status."""
    # Rank 0 ends this process (close) or its death does: a SIGTERM or Ctrl-C meant for
    # the job's processes must not cut the logs short here.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # What the fork copied stays as it is: a collection here could run the finalizers of
    # the training process's objects (tensors, device memory, sockets). The collector was
    # off since before the fork (stuck.no_collection_across_fork); frozen, it is safe again.
    gc.freeze()
    gc.enable()
    # A start that hangs says where, in the rank's log, before rank 0 gives up on it
    # (control_process.START_S); one such hang was seen once and not understood.
    faulthandler.dump_traceback_later(START_DUMP_S, file=sys.stderr)
    with contextlib.suppress(OSError):  # so that ps and top show what it is (Linux)
        Path("/proc/self/comm").write_text(NAME)
    known = dict(facts)
    checks = rules(coordinator["world_size"], lambda: known.get("resize"),
                   lambda: known.get("averaging"), lambda: known.get("batch_step"))
    store.mirror(dict(store.view), {n: s.to_wire() for n, s in store.specs.items()}, checks)
    return ForkedCoordinator(sock, parent, store, checks, known, **coordinator).run()


def below_the_ranks(nice: int) -> None:
    """Every thread of this process ``nice`` steps below where it is. On Linux a nice value
    is a thread's own (``os.nice`` moves only the caller): ZeroMQ's I/O threads, which send
    every answer and publication, stayed at the ranks' priority when only this thread was
    moved. Best effort, as a priority is: without /proc, only this thread moves."""
    try:
        tids = [int(task.name) for task in Path("/proc/self/task").iterdir()]
    except (OSError, ValueError):
        tids = [threading.get_native_id()]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that has just ended
            os.setpriority(os.PRIO_PROCESS, tid,
                           min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


class ForkedCoordinator(Coordinator):
    # Metrics reach this process in rank 0's link batches, already 50 ms apart (BATCH_S): a
    # second 50 ms gate here, on a clock of its own, doubled the live delay (a subscriber saw
    # a step 48-65 ms after it at the median, against 27 ms with the thread). Below BATCH_S
    # a link batch is published as it comes, and still at most 25 times a second.
    PUBLISH_EVERY_S = 0.8 * BATCH_S

    def __init__(self, sock: socket.socket, parent: int, store: HParamStore,
                 checks: tuple[Constraint, ...], facts: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(validate=store.validate, pid=parent, **kwargs)
        self._link, self._reader, self._parent = sock, Reader(sock), parent
        self._store, self._facts = store, facts
        self._checks = checks
        self._forwarded: dict[str, Command] = {}  # handed to rank 0, not yet applied
        self._cancelling: dict[str, tuple[list[bytes], Message, str | None]] = {}
        self._orphaned = False  # rank 0 died
        self._nice = settings.coordinator_nice(os.environ)  # checked by rank 0

    def run(self) -> int:
        try:
            self._open()
        except Exception as exc:  # rank 0's start() raises it
            self._link.sendall(encode([["failed", f"{type(exc).__name__}: {exc}"]]))
            return 1
        self._link.sendall(encode([["ready"]]))
        faulthandler.cancel_dump_traceback_later()
        # Below the ranks' priority, once started (a start at nice 10 on a machine the ranks
        # of other jobs fill could take long): on a machine whose cores the ranks fill, a
        # coordinator waking for each request would otherwise take a core from a rank, and
        # every other rank waits for that one at the next all-reduce. (A thread of rank 0
        # could not be put below it: holding the interpreter lock, it would hold the training
        # thread up.)
        below_the_ranks(self._nice)
        self._serve(self._link.fileno())
        # The process ends right after: what the sockets still hold (the last batch of
        # records, the last answers) is delivered first, for up to LINGER_MS
        # (_close_sockets); a process that exits at once would drop it.
        zmq.Context.instance().term()
        return 0

    def _send(self, *items: list[Any]) -> None:
        self._link.sendall(encode(list(items)))

    # ---- the loop -------------------------------------------------------------------------
    def _cycle(self, poller: zmq.Poller) -> bool:
        if os.getppid() != self._parent:  # rank 0 is gone (its end of the link may be held
            self._orphaned = True          # open by its own children: not only EOF tells)
            return False
        return super()._cycle(poller) and not self._orphaned

    def _on_wake(self) -> None:
        try:
            items = self._reader.read()
        except OSError:
            items = None
        if items is None:
            self._orphaned = True
            return
        put = self._outbox.put
        for item in items:
            kind = item[0]
            if kind in ("metric", "event"):
                put((kind, item[1]))
            elif kind == "status":
                status = item[1]
                if "hparams" in status and "specs" in status:
                    self._store.mirror(status["hparams"], status["specs"], self._checks)
                put(("status", status))
            elif kind == "facts":
                self._facts.clear()
                self._facts.update(item[1])
            elif kind == "state":
                put(("state", JobState(item[1]), item[2], item[3]))
            elif kind == "applied":
                put(("applied", Command.from_json(item[1]), item[2]))
            elif kind == "checkpoint":
                put(("checkpoint", Command.from_json(item[1]), None))
            elif kind == "written":
                put(("written", Written(Command.from_json(item[1]), item[2],
                                        Path(item[3]) if item[3] else None, item[4], item[5],
                                        item[6])))
            elif kind == "cancelled":
                self._cancelled(item[1], item[2])
            elif kind == "close":
                put(("close", JobState(item[1]), item[2]))

    def _close_sockets(self) -> None:
        for sock in (self._server.socket, self._pub.socket):
            sock.setsockopt(zmq.LINGER, LINGER_MS)  # bounded: a stuck subscriber holds on
        super()._close_sockets()

    def _shutdown(self) -> None:
        if self._orphaned:  # keep what was logged; the job's end is the supervisor's to say
            self.journal.flush()
            self._send_answers()
            self._close_sockets()
            return
        super()._shutdown()

    # ---- commands, across the link ----------------------------------------------------------
    def _hand_over(self, cmd: Command) -> None:
        self._forwarded[cmd.id] = cmd
        self._send(["command", cmd.to_json()])

    def _unanswered(self) -> list[Command]:
        return list(self._forwarded.values())

    def _on_applied(self, cmd: Command, step: int) -> None:
        self._forwarded.pop(cmd.id, None)
        super()._on_applied(cmd, step)

    def _on_checkpoint(self, cmd: Command, state: dict[str, Any] | None) -> None:
        self._forwarded.pop(cmd.id, None)
        self._send(["extras", cmd.id, self._checkpoint_extras()])

    def _cancel(self, req_id: str, identity: list[bytes], msg: Message) -> dict[str, Any] | None:
        if req_id in self._replies.done:
            return {"ok": True, "cancelled": False, "reply": self._replies.done[req_id]}
        cmd = next((c for c in self._forwarded.values() if c.req_id == req_id), None)
        if cmd is None:
            return {"ok": True, "cancelled": False,
                    "in_flight": req_id in self._replies.waiting}
        # Only rank 0 knows whether its training thread took it: ask, answer then.
        self._cancelling[cmd.id] = (identity, msg, cmd.req_id)
        self._send(["cancel", cmd.id])
        return None

    def _cancelled(self, cmd_id: str, removed: bool) -> None:
        identity, msg, req_id = self._cancelling.pop(cmd_id)
        if removed and cmd_id in self._forwarded:
            reply = self._withdrawn(self._forwarded.pop(cmd_id))
        elif req_id is not None and req_id in self._replies.done:
            reply = {"ok": True, "cancelled": False, "reply": self._replies.done[req_id]}
        else:
            reply = {"ok": True, "cancelled": False, "in_flight": True}
        self._answer(identity, msg, reply)
