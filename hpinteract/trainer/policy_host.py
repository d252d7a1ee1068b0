"""Built-in policies inside the job: decided on rank 0, applied through the commands' path.

Runs in: rank 0's coordinator. It feeds the records the coordinator logs to a
``PolicySet``, turns the decisions into commands (validated like a client's, queued for the
next step boundary, so every rank applies them at the same step) and writes every decision,
suspension and failure to the events log. Policies arrive as objects from ``hpi.init`` or by
name with JSON parameters from a client: no code travels over the wire.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..policies import REGISTRY, create
from ..policies.base import Policy
from ..policies.host import Decision, PolicySet
from ..protocol.errors import HpiError, InvalidCommand
from ..protocol.messages import new_id
from .commands import Command

log = logging.getLogger(__name__)


class JobPolicies:
    def __init__(
        self, world_size: int, *, validate: Callable[[dict[str, Any]], dict[str, Any]],
        submit: Callable[[Command], None], record: Callable[[dict[str, Any]], None],
    ) -> None:
        self.set = PolicySet(world_size=world_size)
        self._validate, self._submit, self._record = validate, submit, record
        self._started = False
        self._guarding: set[str] = set()  # policies whose snapshots the ranks were asked for
        self._queued: list[tuple[Policy, int]] = []  # given to init: started on first status
        # Built-ins a client added by name: how to make them again after a restart or resize.
        self._added: dict[str, dict[str, Any]] = {}
        self._unrestored: list[dict[str, Any]] = []

    def add_initial(self, policies: list[Any],
                    saved: Sequence[dict[str, Any]] = ()) -> None:
        """Init's policies, started with the job's first status; ``saved`` are the states
        a checkpoint holds (a resumed job), given back to the policies of the same name."""
        states = {s.get("name"): s.get("state") for s in saved if isinstance(s, dict)}
        for item in policies:
            policy, every = item if isinstance(item, tuple) else (item, 1)
            if not isinstance(policy, Policy):
                raise InvalidCommand(f"hpi.init(policies=...) takes Policy objects, got "
                                     f"{type(policy).__name__}")
            state = states.get(policy.policy_name)
            if state:
                policy.load_state_dict(state)
            self._queued.append((policy, every))
        # Those a client had added by name: made again from their name and parameters.
        mine = {p.policy_name for p, _ in self._queued}
        for item in saved:
            added = item.get("added") if isinstance(item, dict) else None
            if not isinstance(added, dict) or item.get("name") in mine:
                continue
            try:
                policy = self._make(added)
                if item.get("state"):
                    policy.load_state_dict(item["state"])
            except HpiError as exc:  # reported once the logs are open (_start)
                self._unrestored.append({"kind": "policy", "policy": item.get("name"),
                                         "status": "failed",
                                         "error": f"not restored: {exc.message}"})
                continue
            self._queued.append((policy, int(added.get("every", 1))))
            self._added[policy.policy_name] = added

    # ---- what the coordinator sees ------------------------------------------------------------
    def on_status(self, status: Mapping[str, Any]) -> None:
        if "hparams" in status:
            self.set.observe_status(status["hparams"], status.get("specs"))
        # Start init's policies once the job knows its hyper-parameters (after watch()).
        if status.get("watched"):
            self._start()

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        for notice in self._unrestored:
            self._record(notice)
        queued, self._queued = self._queued, []
        for policy, every in queued:
            try:
                decisions = self.set.add(policy, every)
            except HpiError as exc:
                self._record({"kind": "policy", "status": "rejected", "reason": exc.message})
                continue
            self._carry_out(decisions)

    def on_records(self, records: list[dict[str, Any]]) -> None:
        self._start()  # a script without watch() starts them with its first step
        if self.set.entries:
            self._carry_out(self.set.observe(records))

    def on_applied(self, cmd: Command, step: int) -> None:
        if cmd.op in ("set", "rollback"):
            self.set.on_applied(cmd.values, cmd.source, step)
        elif cmd.source.startswith("policy:"):
            self.set.settle(cmd.source[len("policy:"):])
        self._flush()

    @staticmethod
    def _make(added: Mapping[str, Any]) -> Policy:
        policy = create(added["builtin"], added.get("params") or {})
        alias = added.get("alias")
        if isinstance(alias, str) and alias:
            policy.name = alias
        return policy

    def state(self) -> list[dict[str, Any]]:
        """Every policy's description and ``state_dict``, for a checkpoint (with how to make
        it again, for those a client added by name)."""
        out = []
        for entry in self.set.entries.values():
            item = entry.describe()
            if entry.name in self._added:
                item["added"] = self._added[entry.name]
            try:
                item["state"] = entry.policy.state_dict()
            except Exception as exc:  # a checkpoint is not lost for one policy's state
                item["state"], item["state_error"] = None, f"{type(exc).__name__}: {exc}"
            out.append(item)
        return out

    # ---- requests from clients ------------------------------------------------------------------
    def handle(self, type_: str, content: Mapping[str, Any]) -> dict[str, Any]:
        if type_ == "policies":
            return {"ok": True, "policies": self.set.describe(), "available": sorted(REGISTRY)}
        name = content.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidCommand(f"{type_} needs a policy 'name'")
        if type_ == "add_policy":
            params = content.get("params") or {}
            if not isinstance(params, dict):
                raise InvalidCommand("'params' must be an object of the policy's arguments")
            added = {"builtin": name, "params": params, "every": content.get("every", 1),
                     "alias": content.get("alias")}
            policy = self._make(added)
            self._carry_out(self.set.add(policy, added["every"]))
            self._added[policy.policy_name] = added
        elif type_ == "remove_policy":
            self.set.remove(name)
            self._added.pop(name, None)
            if name in self._guarding:
                self._guarding.discard(name)
                self._submit(Command("guard", new_id(), f"policy:{name}", extra={"every": 0}))
        elif type_ == "enable_policy":
            self.set.enable(name)
        else:
            raise InvalidCommand(f"unknown request type {type_!r}")
        self._flush()
        return {"ok": True, "policies": self.set.describe()}

    # ---- decisions become commands --------------------------------------------------------------
    def _carry_out(self, decisions: list[Decision]) -> None:
        for d in decisions:
            try:
                self._submit(self._command(d))
            except HpiError as exc:  # e.g. a value out of the spec's bounds: nothing applied
                self.set.settle(d.name, f"{exc.message}; nothing applied")
        for entry in self.set.entries.values():
            every = getattr(entry.policy, "snapshot_every", 0)
            if every and entry.name not in self._guarding:
                self._guarding.add(entry.name)
                self._submit(Command("guard", new_id(), entry.source, extra={"every": every}))
        self._flush()

    def _command(self, d: Decision) -> Command:
        change = d.change
        values = self._validate(dict(change.values)) if change.values else {}
        if change.action == "stop":
            return Command("stop", new_id(), d.source, reason=change.reason)
        if change.action == "rollback":
            to_step = change.to_step if change.to_step is not None else d.step
            return Command("rollback", new_id(), d.source, values, reason=change.reason,
                           extra={"to_step": int(to_step)})
        return Command("set", new_id(), d.source, values, reason=change.reason)

    def _flush(self) -> None:
        for notice in self.set.take_notices():
            if notice.get("status") == "failed":
                log.error("policy %s failed:\n%s", notice.get("policy"), notice.get("error"))
            self._record(notice)
