"""Rank 0's coordinator: the job's control endpoint, metrics publisher and run log writer.

Runs in: a daemon thread of rank 0, or with ``HPINTERACT_COORDINATOR=process`` a process of
its own, forked from rank 0 (forked.py, control_process.py); "this thread" below is
whichever runs it, and "the training thread" is rank 0's. It owns every socket of the job
(ROUTER for control, PUB for metrics and events) and the append-only logs. The training
thread never blocks on it: metrics go into a queue that this thread drains, logs and
publishes; commands are validated here and queued for the next step boundary, where the
training thread hands them to every rank with one collective and posts back the step at
which they took effect. Only then does the client get its acknowledgement. Requests are
served by its base class, ``RequestDesk`` (requests.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import deque
from typing import Any

import zmq

from ..protocol.connection import ConnectionInfo, new_key
from ..protocol.errors import CheckpointError, InvalidState
from ..protocol.messages import Message
from ..protocol.rundir import RunDir
from ..protocol.states import JobState
from ..transport.control import ControlServer
from ..transport.curve import ServerKeys, curve_wanted
from ..transport.pubsub import Publisher
from .checkpoint import CheckpointWriter, Written
from .commands import Command, RateLimit, Replies
from .journal import PUBLISH_EVERY_S, Journal
from .nodes import advertised
from .policy_host import JobPolicies
from .requests import RequestDesk, Validate

log = logging.getLogger(__name__)

PERIODIC_SOURCE = "job:checkpoint_every"  # the source of periodic checkpoints


class Coordinator(RequestDesk):
    PUBLISH_EVERY_S = PUBLISH_EVERY_S  # the journal's (a coordinator process has its own)

    def __init__(
        self, run_dir: RunDir, *, validate: Validate, world_size: int, ip: str = "127.0.0.1",
        policies: list[Any] | None = None, resumed: dict[str, Any] | None = None,
        pid: int | None = None,
    ) -> None:
        """``resumed`` is the checkpoint a resumed job continues from: its change history
        goes on in later checkpoints, and init's policies get their saved state back.
        ``pid`` is rank 0's, for the connection file (a coordinator process is not it)."""
        self.run_dir = run_dir
        self._pid = pid if pid is not None else os.getpid()
        self._history = list((resumed or {}).get("changes") or [])
        self._validate = validate
        self._ip = ip
        self.world_size = world_size
        self.pending: deque[Command] = deque()  # popped by the training thread
        self.command_ready = threading.Event()  # lets a paused loop wake at once
        self._outbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="hpi-coordinator", daemon=True)
        self._startup_error: BaseException | None = None
        # The views below are owned by the coordinator thread.
        self._intended = JobState.STARTING  # the state once queued commands have applied
        self._unapplied = 0  # commands queued or taken by the training thread, not yet applied
        self._security = RateLimit(per_minute=30)
        # Answers go out at the end of the cycle that made them, after one write of the
        # events log (_send_answers): a change is on record before anyone is told it applied.
        self._answers: list[tuple[list[bytes], Message | None, dict[str, Any], str | None]] = []
        self._replies = Replies(self._answer)
        self.policies = JobPolicies(world_size, validate=validate, submit=self._enqueue,
                                    record=self._record_event)
        self.policies.add_initial(policies or [], (resumed or {}).get("policies") or [])
        self.info: ConnectionInfo | None = None
        self.journal: Journal  # the logs, opened by the coordinator thread
        self._writer: CheckpointWriter | None = None  # started by the first checkpoint
        self._served_at = 0.0  # when a cycle last served requests (_request_gate)

    # ---- called from the training thread -------------------------------------------------
    def start(self) -> ConnectionInfo:
        self._thread.start()
        self._ready.wait(30)
        if self._startup_error is not None or self.info is None:
            raise RuntimeError(f"coordinator failed to start: {self._startup_error}")
        return self.info

    def post(self, *item: Any, wake: bool = True) -> None:
        self._outbox.put(item)
        if wake:
            self._wake()

    def _wake(self) -> None:
        os.write(self._wake_w, b"x")

    def take_pending(self) -> list[Command]:
        out = []
        while self.pending:
            out.append(self.pending.popleft())
        self.command_ready.clear()
        if self.pending:  # raced with a new command: keep the flag up
            self.command_ready.set()
        return out

    def close(self, state: JobState, error: dict[str, Any] | None = None) -> None:
        self.post("close", state, error)
        self._thread.join(10)

    # ---- the coordinator thread (or process: forked.py) ----------------------------------
    def _main(self) -> None:
        try:
            self._open()
        except BaseException as exc:  # reported to the training thread by start()
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        self._serve(self._wake_r)

    def _open(self) -> None:
        """Bind the sockets, open the logs and write the connection file."""
        ctx: zmq.Context[Any] = zmq.Context.instance()
        key = new_key()
        curve = ServerKeys.new() if curve_wanted(self._ip) else None
        self._server = ControlServer(ctx, key.encode(), self._ip, curve)
        self._pub = Publisher(ctx, key.encode(), self._ip, curve)
        self.journal = Journal(self.run_dir, self._pub, self.world_size, self._pid,
                               self.PUBLISH_EVERY_S)
        self.journal.changes = self._history
        self.info = ConnectionInfo(
            job_id=self.run_dir.job_id, ip=advertised(self._ip),
            control_port=self._server.port,
            pub_port=self._pub.port, key=key, pid=self._pid,
            curve_server_key=curve.public.decode() if curve else "",
        )
        self.info.write(self.run_dir.connection)

    def _serve(self, wake_fd: int) -> None:
        """The loop, until the training thread closes the job; ``wake_fd`` is readable when
        it has news."""
        self._wake_fd = wake_fd
        poller = zmq.Poller()
        poller.register(self._server.socket, zmq.POLLIN)
        poller.register(wake_fd, zmq.POLLIN)
        self._news_only = zmq.Poller()  # while requests wait for each other (_request_gate)
        self._news_only.register(wake_fd, zmq.POLLIN)
        running = True
        while running:
            try:
                running = self._cycle(poller)
            except Exception:  # the control plane must outlive any one bad cycle
                log.exception("hpinteract coordinator: error in a cycle (continuing)")
        self._shutdown()

    def _cycle(self, poller: zmq.Poller) -> bool:
        # 50 ms: live plots get 20 batches a second, and an idle job costs next to nothing.
        wait = self.journal.wait_s(0.05)
        opens = self._served_at + self._request_gate()
        held = time.monotonic() < opens
        if held:  # only the training thread's news (acks are never held)
            poller, wait = self._news_only, min(wait, opens - time.monotonic())
        ready = dict(poller.poll(max(1, round(1000 * wait))))
        if self._wake_fd in ready:
            self._on_wake()
        try:
            if self._server.socket in ready or (held and time.monotonic() >= opens):
                self._serve_waiting()
            running = self._drain()
            if self._writer is not None:
                for written in self._writer.finished():
                    self._on_written(written)
        finally:  # what was answered is sent even if a later part of the cycle raised
            self._send_answers()
        self.journal.end_cycle()
        return running

    def _on_wake(self) -> None:
        os.read(self._wake_r, 65536)

    def _drain(self) -> bool:
        while True:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                records = self.journal.take_fresh()
                if records:
                    self.policies.on_records(records)
                    self.journal.annotations = self.policies.set.reports()
                return True
            kind = item[0]
            if kind == "metric":
                self.journal.metric(item[1])
            elif kind == "applied":
                self._on_applied(item[1], item[2])
            elif kind == "checkpoint":
                self._on_checkpoint(item[1], item[2])
            elif kind == "written":  # a coordinator process's: rank 0 wrote it
                self._on_written(item[1])
            elif kind == "status":
                self.journal.update_status(item[1])
                self.policies.on_status(item[1])
            elif kind == "state":
                self._set_state(item[1], item[2], item[3])
            elif kind == "event":
                self._record_event(item[1])
            elif kind == "close":
                self._final = (item[1], item[2])
                return False

    def _record_event(self, event: dict[str, Any]) -> None:
        self.journal.event(event)

    def _unanswered(self) -> list[Command]:
        """Commands no rank has applied (answered at the end: the job ended first)."""
        return list(self.pending)

    def _set_state(self, state: JobState, step: int, source: str) -> None:
        if self.journal.set_state(state, step, source) and self._unapplied == 0:
            self._intended = state  # nothing queued or in flight could still change it

    def _on_applied(self, cmd: Command, step: int) -> None:
        if cmd.tracked:
            self._unapplied -= 1
        reply: dict[str, Any] = {"ok": True, "change_id": cmd.id, "applied_at_step": step}
        why = {"reason": cmd.reason} if cmd.reason else {}
        if cmd.op == "rollback":
            self._record_event({"kind": "rollback", "id": cmd.id, "source": cmd.source,
                                "step": step, **cmd.extra, **why})
        elif cmd.op == "guard":  # so a person (and a test) sees since when snapshots are kept
            self._record_event({"kind": "guard", "id": cmd.id, "source": cmd.source,
                                "step": step, "snapshot_every": cmd.extra.get("every", 0)})
        if cmd.op in ("set", "rollback") and cmd.values:
            reply["values"] = cmd.values
            was = {"previous": cmd.previous} if cmd.previous else {}
            self._record_event({
                "kind": "change", "id": cmd.id, "source": cmd.source, "values": cmd.values,
                "status": "applied", "applied_at_step": step, **was, **why,
            })
        else:
            reply["state"] = cmd.op
        self.policies.on_applied(cmd, step)
        self._replies.finish(cmd.req_id, reply)  # sent once logged (_send_answers)

    def _on_checkpoint(self, cmd: Command, state: dict[str, Any]) -> None:
        """The training thread's copy, completed with what this thread owns, goes to the
        writer; the requester is answered once the file is on disk."""
        state.update(self._checkpoint_extras())
        if self._writer is None:
            self._writer = CheckpointWriter(self.run_dir.checkpoints_dir,
                                            wake=self._wake)
        self._writer.submit(state, cmd, periodic=cmd.source == PERIODIC_SOURCE)

    def _checkpoint_extras(self) -> dict[str, Any]:
        """What this thread owns of a checkpoint: the policies' state and the history."""
        return {"job_id": self.run_dir.job_id, "policies": self.policies.state(),
                "changes": list(self.journal.changes)}

    def _on_written(self, w: Written) -> None:
        cmd: Command = w.token
        if cmd.tracked:
            self._unapplied -= 1
        event = {"kind": "checkpoint", "id": cmd.id, "source": cmd.source, "step": w.step,
                 "seconds": round(w.seconds, 4)}
        if w.error is not None:
            self._record_event({**event, "status": "failed", "error": w.error})
            self._replies.finish(cmd.req_id, {"ok": False, "error": CheckpointError(
                f"checkpoint at step {w.step} failed: {w.error}").to_wire()})
            return
        assert w.path is not None
        self._record_event({**event, "status": "written", "file": str(w.path), "bytes": w.size})
        self._replies.finish(cmd.req_id, {"ok": True, "change_id": cmd.id, "state": "checkpoint",
                                          "applied_at_step": w.step, "path": str(w.path)})

    def _shutdown(self) -> None:
        state, error = self._final
        try:
            if self._writer is not None:  # what was captured is written and answered first
                self._writer.close()
                for written in self._writer.finished():
                    self._on_written(written)
            for cmd in self._unanswered():
                self._replies.finish(cmd.req_id, {"ok": False, "error": InvalidState(
                    f"the job ended ({state.value}) before the {cmd.op} could apply").to_wire()})
            self.pending.clear()
        finally:
            self._send_answers()  # before the logs close: the events log is written first
        try:
            self.journal.close(state, error)
        except OSError:  # a full disk: the sockets still close and the connection file goes
            log.exception("hpinteract coordinator: the logs could not be closed cleanly")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.run_dir.connection)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._server.close()
        self._pub.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
