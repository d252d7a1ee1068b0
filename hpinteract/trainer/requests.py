"""The coordinator's requests: verify, answer or queue each control message a client sends.

Runs in: rank 0's coordinator, as part of ``Coordinator`` (a base class of it: the
request side and the loop share the coordinator's state, and a request is served in the
loop's cycle). A query is answered in the cycle that serves it; a command is validated,
queued for the next step boundary and answered once applied (coordinator.py); anything
wrong gets a typed error, and nothing of it is queued. Every answer goes out at the end of
the cycle that made it, once the events log is written; requests that come close together
are served together (``_request_gate``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..protocol.errors import HpiError, InvalidCommand, InvalidState
from ..protocol.messages import Message, new_id
from ..protocol.rundir import RunDir
from ..protocol.states import ALLOWED, JobState
from ..transport.control import ControlServer, Rejected
from .commands import Command, RateLimit, Replies, int_field, note_of, reason_of, source_of
from .journal import Journal
from .policy_host import JobPolicies

log = logging.getLogger(__name__)

Validate = Callable[[dict[str, Any]], dict[str, Any]]  # the job's hyper-parameter check
HISTORY_PAGE = 20_000
POLICY_REQUESTS = ("policies", "add_policy", "remove_policy", "enable_policy")
# Requests that come close together are served together: a request served at once only
# waits in ``pending`` for the next sync point, so one that waits a little first applies at
# the same step unless that sync point comes in between. After a cycle that served
# requests, the next ones wait up to this share of the time between sync points (rank 0's
# status says it: ``sync_s``), and never longer than REQUEST_GATE_MAX_S. Under 100 set()s
# a second each wake-up cost the coordinator more than the request itself (its code and
# data gone cold in the caches, and in the thread rank 0's interpreter lock taken once
# more); with sync at every step (``sync_every=1``) the gate is a fraction of a step.
REQUEST_GATE_SHARE = 0.5
REQUEST_GATE_MAX_S = 0.05


class RequestDesk:
    """The request side of the coordinator (its subclass sets every attribute below)."""

    run_dir: RunDir
    world_size: int
    journal: Journal
    policies: JobPolicies
    pending: deque[Command]  # popped by the training thread
    command_ready: threading.Event
    _server: ControlServer
    _security: RateLimit
    _replies: Replies
    _validate: Validate
    _intended: JobState  # the state once queued commands have applied
    _unapplied: int  # commands queued or taken by the training thread, not yet applied
    _answers: list[tuple[list[bytes], Message | None, dict[str, Any], str | None]]
    _served_at: float  # when a cycle last served requests (_request_gate)

    def _record_event(self, event: dict[str, Any]) -> None:
        """Write an event to the job's events log (the coordinator's journal does)."""
        raise NotImplementedError  # Coordinator's own

    def _request_gate(self) -> float:
        """How long requests wait for each other after a cycle that served some."""
        sync_s = self.journal.status.get("sync_s")
        if not isinstance(sync_s, float | int) or sync_s <= 0:
            return 0.0
        return min(REQUEST_GATE_MAX_S, REQUEST_GATE_SHARE * float(sync_s))

    def _answer(self, identity: list[bytes], msg: Message | None, reply: dict[str, Any],
                req_id: str | None = None) -> None:
        """Queue a reply for the end of this cycle (``req_id`` when there is no ``msg``)."""
        self._answers.append((identity, msg, reply, req_id))

    def _send_answers(self) -> None:
        """The cycle's answers, after the events log is written (a write, not an fsync: a
        kill -9 of the job keeps it). Under load a boundary applies several changes at
        once: one write for them all, where each had cost a write of its own (a syscall and,
        in the coordinator thread, rank 0's interpreter lock)."""
        if not self._answers:
            return
        answers, self._answers = self._answers, []
        try:
            self.journal.events.flush()
        except (OSError, ValueError):
            # A full disk: the changes have applied all the same, and saying so is the
            # truth; withholding the answers would leave every client waiting for nothing.
            log.exception("hpinteract coordinator: the events log could not be written")
        for identity, msg, reply, req_id in answers:
            try:
                self._server.reply(identity, msg, reply, req_id)
            except Exception:  # one bad answer must not cost the others theirs
                log.exception("hpinteract coordinator: an answer could not be sent")

    def _serve_waiting(self) -> None:
        """Serve the requests that have arrived (at most 1000: the outbox waits too)."""
        served = 0
        while served < 1000 and self._server.socket.poll(0):
            self._serve_one()
            served += 1
        if served:
            self._served_at = time.monotonic()

    def _serve_one(self) -> None:
        try:
            identity, msg = self._server.recv()
        except Rejected as exc:
            log.warning("rejected a control message: %s", exc)
            logged = self._security.allow()  # a flood is counted, not logged line by line
            if logged:
                self._record_event({"kind": "security", "status": "rejected",
                                    "reason": str(exc), **self._security.suppressed()})
            if logged or exc.signed:  # a key holder is always told what was wrong
                self._answer(exc.identity, None, {"ok": False, "error": exc.error.to_wire()},
                             exc.req_id)
            return
        if self._replies.retry(identity, msg):
            return
        try:
            try:
                reply = self._handle(identity, msg)
            except HpiError:
                raise
            except (ValueError, TypeError, KeyError, AttributeError, OverflowError,
                    RecursionError) as exc:
                raise InvalidCommand(f"malformed {msg.type!r} request: {exc}") from None
        except HpiError as exc:
            if msg.type == "set":
                self._record_event({
                    "kind": "change", "id": new_id(), "source": source_of(msg),
                    "values": msg.content.get("values"), "status": "rejected",
                    "error": exc.message, "field": exc.field,
                })
            reply = {"ok": False, "error": exc.to_wire()}
        if reply is not None:
            self._answer(identity, msg, reply)

    def _handle(self, identity: list[bytes], msg: Message) -> dict[str, Any] | None:
        t = msg.type
        if t in ("hello", "get", "status"):
            j = self.journal
            return {"ok": True, "job_id": self.run_dir.job_id, "state": j.state.value,
                    "world_size": self.world_size, "latest": j.latest, **j.status}
        if t == "history":
            since = int_field(msg.content, "since", 0)
            limit = max(1, min(int_field(msg.content, "limit", HISTORY_PAGE), HISTORY_PAGE))
            records, more = self.journal.page(since, limit)
            return {"ok": True, "records": records, "more": more, "head": self.journal.seq}
        if t == "cancel":
            return self._cancel(str(msg.content.get("req_id")), identity, msg)
        if t in POLICY_REQUESTS:
            return self.policies.handle(t, msg.content)
        if t == "note":  # a client-side policy's decision or failure, for the events log
            self._record_event(note_of(msg.content))
            return {"ok": True}
        if t not in ALLOWED:
            raise InvalidCommand(f"unknown request type {t!r}")
        if self._intended not in ALLOWED[t]:  # before validating: the state is the news
            raise InvalidState(f"cannot {t} a job that is {self._intended.value}")
        if t == "checkpoint" and not self.journal.status.get("watched"):
            raise InvalidState("nothing to checkpoint: the script has not called "
                               "run.watch(model, optimizer)")
        values: dict[str, Any] = {}
        if t == "set":
            raw = msg.content.get("values")
            if not isinstance(raw, dict):
                raise InvalidCommand("set needs a 'values' object")
            values = self._validate(raw)
        cmd = Command(t, new_id(), source_of(msg), values, msg.header.req_id,
                      reason=reason_of(msg.content))
        if cmd.req_id is not None:
            self._replies.wait(cmd.req_id, identity, msg)
        self._enqueue(cmd)
        return None  # answered once applied, with the step

    def _enqueue(self, cmd: Command) -> None:
        """Queue a validated command (a client's or a policy's) for the next step boundary."""
        if cmd.op in ALLOWED and self._intended not in ALLOWED[cmd.op]:
            raise InvalidState(f"cannot {cmd.op} a job that is {self._intended.value}")
        self._intended = {"pause": JobState.PAUSED, "resume": JobState.RUNNING,
                          "stop": JobState.STOPPING}.get(cmd.op, self._intended)
        self._unapplied += 1
        self._hand_over(cmd)

    def _hand_over(self, cmd: Command) -> None:
        """Make ``cmd`` available to the training thread's next sync point."""
        self.pending.append(cmd)
        self.command_ready.set()

    def _cancel(self, req_id: str, identity: list[bytes], msg: Message) -> dict[str, Any] | None:
        """A client gave up waiting: withdraw its command if it has not been taken yet, so
        that a request that raised on the client never applies later. (None: answered
        later, as a coordinator process does.)"""
        if req_id in self._replies.done:
            return {"ok": True, "cancelled": False, "reply": self._replies.done[req_id]}
        cmd = next((c for c in list(self.pending) if c.req_id == req_id), None)
        if cmd is None:
            return {"ok": True, "cancelled": False,
                    "in_flight": req_id in self._replies.waiting}
        try:
            self.pending.remove(cmd)
        except ValueError:  # the training thread took it a moment ago
            return {"ok": True, "cancelled": False, "in_flight": True}
        return self._withdrawn(cmd)

    def _withdrawn(self, cmd: Command) -> dict[str, Any]:
        """The books of a command taken back before any rank applied it."""
        if cmd.req_id is not None:
            self._replies.waiting.pop(cmd.req_id, None)
        self._unapplied -= 1
        if self._unapplied == 0:
            self._intended = self.journal.state
        if cmd.op == "set":
            self._record_event({"kind": "change", "id": cmd.id, "source": cmd.source,
                                "values": cmd.values, "status": "cancelled"})
        return {"ok": True, "cancelled": True}
