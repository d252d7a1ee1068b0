"""A notebook's own policies: run in the client process on the job's streamed metrics.

Runs in: a client process, on one daemon thread per job. The user's Policy (or plain
function) sees the same ``Context`` a built-in sees in the job; what it returns goes
through ``job.set`` with source ``policy:<name>``, so it is validated by the job and applied
on every rank at one step like any other change. A hook that raises disables its policy
(the traceback is kept, logged and written to the job's events); the job trains on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..policies.base import Context, FunctionPolicy, Policy
from ..policies.host import Decision, PolicySet
from ..protocol.errors import HpiError

if TYPE_CHECKING:
    from .job import Job

log = logging.getLogger(__name__)


class ClientPolicies:
    def __init__(self, job: Job) -> None:
        self.job = job
        self.set = PolicySet()
        self._lock = threading.Lock()  # the set is used by the caller's and the policy thread
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def add(self, policy: Policy | Callable[[Context], Any], every: int = 1,
            name: str | None = None) -> str:
        if not isinstance(policy, Policy):
            if not callable(policy):
                raise TypeError(f"add_policy takes a Policy, a function or a built-in's name, "
                                f"not {type(policy).__name__}")
            policy = FunctionPolicy(policy, name)
        elif name:
            policy.name = name
        status = self.job.status()
        with self._lock:
            self.set.world_size = int(status.get("world_size", 1))
            self.set.observe_status(status.get("hparams", {}), status.get("specs"))
            latest = status.get("latest") or {}
            if "step" in latest:
                self.set.step = int(latest["step"])
            decisions = self.set.add(policy, every)
        self._carry_out(decisions)
        self._ensure_thread()
        return policy.policy_name

    def remove(self, name: str) -> None:
        with self._lock:
            self.set.remove(name)
            idle = not self.set.entries
        self._report()
        if idle:
            self._stop.set()

    def enable(self, name: str) -> None:
        with self._lock:
            self.set.enable(name)
        self._report()

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**d, "where": "client"} for d in self.set.describe()]

    def __contains__(self, name: str) -> bool:
        return name in self.set.entries

    # ---- the policy thread ----------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = threading.Event()
        head = int(self.job._request("history", {"since": 0, "limit": 1}).get("head", 0))
        self._thread = threading.Thread(target=self._main, args=(head,), daemon=True,
                                        name=f"hpi-policies-{self.job.id}")
        self._thread.start()

    def _main(self, since: int) -> None:
        try:
            for rec in self.job.stream(since=since, stop=self._stop):
                # Added before the job had posted its values, or the job was resized: its
                # values and world size as the job has them now.
                if (not self.set.hparams and "step" in rec) or (
                        rec.get("kind") == "resize" and rec.get("status") == "done"):
                    self._refresh()
                with self._lock:
                    if rec.get("kind") == "change" and rec.get("status") == "applied":
                        self.set.on_applied(rec.get("values") or {}, str(rec.get("source")),
                                            int(rec.get("applied_at_step", 0)))
                        decisions: list[Decision] = []
                    else:
                        decisions = self.set.observe([rec])
                self._carry_out(decisions)
        except Exception:  # the thread must not die silently: say why policies stopped
            log.exception("hpinteract: the policy thread of job %s stopped", self.job.id)

    def _refresh(self) -> None:
        status = self.job.status()
        with self._lock:
            self.set.world_size = int(status.get("world_size", self.set.world_size))
            self.set.observe_status(status.get("hparams", {}), status.get("specs"))

    def _carry_out(self, decisions: list[Decision]) -> None:
        for d in decisions:
            try:
                if d.change.action == "stop":
                    self.job.stop(source=d.source)
                elif d.change.action == "rollback":
                    raise HpiError("rollback is only available to policies running in the "
                                   "job (job.add_policy('divergence_guard'))")
                else:
                    self.job.set(dict(d.change.values), source=d.source,
                                 reason=d.change.reason or None)
            except HpiError as exc:  # the job said no: nothing was applied
                with self._lock:
                    self.set.settle(d.name, f"{exc.message}; nothing applied")
        self._report()

    def _report(self) -> None:
        with self._lock:
            notices = self.set.take_notices()
        for n in notices:
            if n["status"] == "failed":
                log.error("hpinteract: policy %s failed and is disabled:\n%s", n["policy"],
                          n.get("error"))
            try:
                self.job._request("note", {k: v for k, v in n.items() if k != "kind"})
            except HpiError:
                log.warning("hpinteract: could not record %s of policy %s in the job",
                            n["status"], n["policy"])
