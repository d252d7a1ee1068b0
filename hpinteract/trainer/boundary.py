"""What a sync point does: the commands every rank applies, rollbacks, snapshots and
checkpoints.

Runs in: every rank's training thread, at sync points (``Run._at_sync_point`` and the
paused loop). Rank 0 takes the coordinator's pending commands and hands them to every rank
with the one collective of ``StepSync``; every rank then applies the same list, in order,
before the same step, which is what makes a change consistent. Rank 0 also posts back at
which step each took effect, and captures checkpoints (after this boundary's changes, so a
checkpoint at step s holds what step s starts from).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ..protocol.messages import new_id
from ..protocol.states import JobState
from .checkpoint import capture
from .commands import Command
from .coordinator import PERIODIC_SOURCE
from .resize import SOURCE as RESIZE_SOURCE
from .resize import leave
from .scaling import with_lr_scaling
from .snapshots import Snapshots

if TYPE_CHECKING:
    from .run import Run

# The state a command puts the job in, as the coordinator records it.
STATE_OF = {"pause": JobState.PAUSED, "resume": JobState.RUNNING, "stop": JobState.STOPPING}


class Boundary:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.snapshots = Snapshots()
        self.saved_at = run.step_index  # step of the newest checkpoint (rank 0)
        self.in_flight: dict[str, Command] = {}  # rank 0: this boundary's commands by id
        self.resize_by: dict[str, Any] = {}  # the change that set a new ``workers``

    def snapshot(self) -> None:
        r = self.run
        self.snapshots.maybe_take(r.step_index, r.model, r.optimizer, r._scheduler)

    def sync(self) -> None:
        r = self.run
        wire = None
        if r._coord is not None:
            cmds = r._coord.take_pending()
            if r.driven is not None:  # a framework's epoch-boundary changes wait there
                cmds = r.driven.gate(cmds)
            if any(c.op == "set" and "batch_size" in c.values for c in cmds):
                cmds = with_lr_scaling(cmds, r.hp, r.store.specs, r._noise_scale)
            self.in_flight = {c.id: c for c in cmds}
            wire = [c.to_wire() for c in cmds]
        agreed = r._sync.exchange(wire)
        # Checkpoints after the changes of this boundary: they are the step's.
        saves = [c for c in agreed if c["op"] == "checkpoint"]
        self.apply([c for c in agreed if c["op"] != "checkpoint"])
        if r.driven is not None:  # the framework's own checkpoint, written by every rank
            for c in saves:
                with r._watch.between_steps():  # a long write is no hang
                    r.driven.save(self.in_flight.pop(c["id"], None), r.step_index)
        elif r._coord is not None and r.model is not None:
            every = int(r.hp["checkpoint_every"])
            todo = [self.in_flight.pop(c["id"]) for c in saves]
            if not todo and every and r.step_index - self.saved_at >= every:
                todo = [Command("checkpoint", new_id(), PERIODIC_SOURCE, tracked=False)]
            for command in todo:
                with r._watch.between_steps():
                    self.checkpoint(command)
        self.maybe_resize()

    def replay(self, cmds: list[dict[str, Any]]) -> None:
        """Apply another job's recorded changes (every rank, the same list at the same
        step: see replay.py); rank 0 has them logged as changes of source ``replay:...``."""
        for wire in cmds:
            of = wire.pop("of", None)
            if self.run._coord is not None:
                self.in_flight[wire["id"]] = Command(
                    wire["op"], wire["id"], wire["source"], wire["values"], tracked=False,
                    reason=(f"{wire['source'].split(':')[0]} change {of}" if of
                            else "replay of the stop"))
        self.apply(cmds)
        self.maybe_resize()

    def maybe_resize(self) -> None:
        """After a boundary whose changes gave ``workers`` a new value (every rank alike):
        checkpoint (rank 0), and leave for the supervisor to restart the job (resize.py)."""
        r = self.run
        to = int(r.hp.get("workers", r.world_size))
        if to == r.world_size:
            return
        began = time.time()
        if r._coord is not None:
            self.checkpoint(Command("checkpoint", new_id(), RESIZE_SOURCE, tracked=False))
            r._coord.post("event", {"kind": "resize", "status": "leaving", "step": r.step_index,
                                    "from": r.world_size, "to": to, **self.resize_by})
        leave(r, to, began, self.resize_by)

    def checkpoint(self, cmd: Command) -> None:
        """Rank 0 copies the state; the coordinator's writer thread puts it on disk."""
        r = self.run
        assert r._coord is not None
        loader = r._loader
        where = None if loader is None else {"epoch": loader.epoch, "position": loader.position}
        state = capture(r.model, r.optimizer, r._scheduler, step=r.step_index, epoch=r.epoch,
                        loader=where, hparams=dict(r.store.view),
                        last_changed=dict(r.store.last_changed))
        self.saved_at = r.step_index
        r._coord.post("checkpoint", cmd, state)

    def apply(self, cmds: list[dict[str, Any]]) -> None:
        """Make this boundary's commands take effect, in order, then say so: one line for
        the rank's log and, on rank 0, one status for all (under load a boundary carries
        ten sets or more: a status and a write each cost the training thread for nothing)."""
        if not cmds:
            return
        r = self.run
        step = r.step_index
        replaced = {cmd["id"]: self._effect(cmd, step) for cmd in cmds}
        if r.driven is not None:  # a framework checkpoint carries them (integrations)
            r.driven.changes.extend({"id": c["id"], "source": c.get("source", "api"),
                                     "values": c["values"], "applied_at_step": step,
                                     "previous": replaced[c["id"]],
                                     # rank 0 holds the whole command (the wire form
                                     # leaves the reason out), and its loggers tell it
                                     "reason": getattr(self.in_flight.get(c["id"]),
                                                       "reason", "")}
                                    for c in cmds if c["op"] in ("set", "rollback")
                                    and c.get("values"))
        r._rank_log.write("".join(json.dumps({"id": c["id"], "op": c["op"], "step": step,
                                              "values": c.get("values", {})}) + "\n"
                                  for c in cmds))
        if r._coord is None:
            return
        # State and status first: a client that reads them right after its ack must
        # already see the change.
        states = [(STATE_OF[c["op"]], c.get("source", "api")) for c in cmds
                  if c["op"] in STATE_OF]
        for state, source in states:
            r._coord.post("state", state, step, source, wake=False)
        if len(states) < len(cmds):
            r._post_status(wake=False)
        for i, c in enumerate(cmds):  # one wake-up for them all: a syscall and a cycle each
            applied = self.in_flight.pop(c["id"])
            applied.previous = replaced[c["id"]]
            r._coord.post("applied", applied, step, wake=i == len(cmds) - 1)

    def _effect(self, cmd: dict[str, Any], step: int) -> dict[str, Any]:
        """Make one command take effect; a set's replaced values (the others': none)."""
        r = self.run
        op = cmd["op"]
        replaced: dict[str, Any] = {}
        if op == "set":
            # A framework's scheduler moves the lr every step behind the store's back: what
            # the set replaced is the lr in force (the optimizer's, before the effect).
            in_force = float(r.optimizer.param_groups[0]["lr"]) \
                if r.driven is not None and "lr" in cmd["values"] else None
            replaced = {n: old for n, (old, _) in r.store.apply(cmd["values"], step).items()}
            if in_force is not None and "lr" in replaced:
                replaced["lr"] = in_force
            if "workers" in cmd["values"]:
                self.resize_by = {"id": cmd["id"], "source": cmd.get("source", "api")}
        elif op == "rollback":
            self.rollback(cmd, step)
        elif op == "guard":
            self.snapshots.configure(int(cmd["extra"]["every"]))
            # At once: a change applied at this same sync point (the guard's first one) must
            # already have a good state to go back to.
            self.snapshot()
        elif op == "pause":
            r.paused = True
        elif op == "resume":
            r.paused = False
        elif op == "stop":
            r.should_stop, r.paused = True, False
        return replaced

    def rollback(self, cmd: dict[str, Any], step: int) -> None:
        r = self.run
        restored = None
        if r.model is not None:
            restored = self.snapshots.restore(int(cmd["extra"]["to_step"]), r.model,
                                              r.optimizer, r._scheduler)
        if restored is not None and r._binding is not None:
            # The optimizer's state brought back its old lr and momentum: re-apply the
            # current values before the change, or the rollback would undo later decisions.
            r._binding.apply({n: r.hp[n] for n in r._binding.supported()})
        if cmd["values"]:
            r.store.apply(cmd["values"], step)
        if r._coord is not None:
            c = self.in_flight[cmd["id"]]
            c.extra = {**c.extra, "restored_step": restored,
                       "status": "restored" if restored is not None else "no snapshot"}
