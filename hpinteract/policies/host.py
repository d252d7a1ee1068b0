"""``PolicySet``: runs policies' hooks on a stream of records and keeps their bookkeeping.

Runs in: the process hosting the policies (rank 0's coordinator, or a client's policy
thread). It decides *when* each hook is called and what a hook's failure or a person's
change means for a policy; the caller decides what to do with the changes it returns
(queue them for the next step boundary, or ``job.set`` them) and records the notices.

Rules: one decision of a policy in flight at a time, and none of another policy driving a
name that a decision in flight changes (a policy reading ``ctx.hparams`` must see the
previous change applied, or two schedules of lr would each scale the old value); a hook
that raises disables its policy, with the traceback in a notice; a manual change of a
hyper-parameter that a policy drives suspends that policy until ``enable``.
"""

from __future__ import annotations

import math
import traceback
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..protocol.errors import InvalidCommand
from .base import Change, Context, Policy, as_change

# Sources of changes that are not a person's: they never suspend a policy.
SYSTEM_SOURCES = ("lr_scaling", "job", "resume", "replay")


def is_manual(source: str) -> bool:
    return not source.startswith("policy:") and source not in SYSTEM_SOURCES


@dataclass
class Entry:
    policy: Policy
    every: int
    enabled: bool = True
    suspended: str | None = None  # why, while suspended
    failed: str | None = None  # the traceback, once failed
    in_flight: bool = False
    pending: frozenset[str] = frozenset()  # the names its decision in flight changes
    last_step: int | None = None
    applied_at: int | None = None
    decisions: int = 0

    @property
    def name(self) -> str:
        return self.policy.policy_name

    @property
    def source(self) -> str:
        return f"policy:{self.name}"

    @property
    def active(self) -> bool:
        return self.enabled and self.suspended is None and self.failed is None

    def describe(self) -> dict[str, Any]:
        status = ("failed" if self.failed else "suspended" if self.suspended
                  else "active" if self.enabled else "disabled")
        return {"name": self.name, "policy": type(self.policy).__name__, "every": self.every,
                "status": status, "drives": list(self.policy.drives),
                "reason": self.suspended, "error": self.failed, "decisions": self.decisions,
                "report": self.report()}

    def report(self) -> dict[str, float]:
        """The policy's finite numbers (a failing or odd report is no report: it must not
        cost the job its records)."""
        if self.failed:
            return {}
        try:
            got = self.policy.report()
            return {str(k): float(v) for k, v in got.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)
                    and math.isfinite(v)}
        except Exception:
            return {}


@dataclass(frozen=True)
class Decision:
    name: str
    source: str
    hook: str
    change: Change
    step: int


class PolicySet:
    def __init__(self, window: int = 512, world_size: int = 1) -> None:
        self.entries: dict[str, Entry] = {}
        self.history: deque[dict[str, Any]] = deque(maxlen=window)
        # The newest value of every training metric: the noise scale, per-rank times and
        # other monitors publish only every few steps, and a policy that runs every N
        # steps must still see their last value, not only what the newest record holds.
        self.latest: dict[str, Any] = {}
        self.evals: deque[dict[str, Any]] = deque(maxlen=64)
        self.hparams: dict[str, Any] = {}
        self.specs: dict[str, Mapping[str, Any]] = {}
        self.world_size = world_size
        self.step = 0
        self.epoch: int | None = None
        self.notices: list[dict[str, Any]] = []  # events for the host to record
        self._changed_at: dict[str, int] = {}  # step of each name's newest applied change

    # ---- membership ------------------------------------------------------------------------
    def add(self, policy: Policy, every: int = 1) -> list[Decision]:
        if not isinstance(policy, Policy):
            raise InvalidCommand(f"a policy must be a Policy or a function, not "
                                 f"{type(policy).__name__}")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise InvalidCommand(f"every must be a positive integer, got {every!r}")
        entry = Entry(policy, every)
        for name in policy.drives:  # a value the job cannot change: refused now, not later
            why = (self.specs.get(name) or {}).get("fixed")
            if why:
                raise InvalidCommand(f"policy {entry.name!r} changes {name}, which cannot "
                                     f"change in this job: {why}")
        if entry.name in self.entries:
            raise InvalidCommand(f"a policy named {entry.name!r} is already running: remove "
                                 "it first or give the new one another name")
        self.entries[entry.name] = entry
        self._notice(entry, "added", f"every {every} steps")
        return self._call(entry, "on_start")

    def remove(self, name: str) -> Entry:
        entry = self._get(name)
        del self.entries[name]
        self._notice(entry, "removed", "")
        return entry

    def enable(self, name: str) -> list[Decision]:
        """Lift a suspension (or a failure: the policy gets another chance)."""
        entry = self._get(name)
        entry.enabled, entry.suspended, entry.failed, entry.in_flight = True, None, None, False
        self._notice(entry, "enabled", "")
        return []

    def disable(self, name: str) -> None:
        entry = self._get(name)
        entry.enabled = False
        self._notice(entry, "disabled", "")

    def describe(self) -> list[dict[str, Any]]:
        return [e.describe() for e in self.entries.values()]

    def reports(self) -> dict[str, float]:
        """Every active policy's report, merged (the records' extra fields)."""
        out: dict[str, float] = {}
        for entry in self.entries.values():
            if entry.active:
                out.update(entry.report())
        return out

    def _get(self, name: str) -> Entry:
        if name not in self.entries:
            known = ", ".join(self.entries) or "none"
            raise InvalidCommand(f"no policy named {name!r} (running: {known})")
        return self.entries[name]

    # ---- what happens in the job ------------------------------------------------------------
    def observe_status(self, hparams: Mapping[str, Any],
                       specs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.hparams.update(hparams)
        if specs:
            self.specs = dict(specs)

    def observe(self, records: Iterable[Mapping[str, Any]]) -> list[Decision]:
        """Feed metric records (train, or ``eval: True``); returns the hooks' decisions."""
        out: list[Decision] = []
        for rec in records:
            if "step" not in rec or "kind" in rec:
                continue  # an event, not a metric record
            self.step = int(rec["step"])
            if rec.get("eval"):
                self.evals.append(dict(rec))
                out += self._each("on_eval")
                continue
            epoch = int(rec.get("epoch", 0))
            if self.epoch is not None and epoch > self.epoch:
                ended, self.epoch = self.epoch, epoch
                out += self._each("on_epoch_end", epoch=ended)
            self.epoch = epoch
            self.history.append(dict(rec))
            self.latest.update(rec)
            for k in ("lr", "batch_size"):  # what the job reports it actually used, unless
                # the record predates the newest change (a late record would undo it here)
                if isinstance(rec.get(k), int | float) and \
                        self.step >= self._changed_at.get(k, -1):
                    self.hparams[k] = rec[k]
            for entry in list(self.entries.values()):
                if self._ready(entry) and (
                        entry.last_step is None or self.step - entry.last_step >= entry.every):
                    entry.last_step = self.step
                    out += self._call(entry, "on_step")
        return out

    def on_applied(self, values: Mapping[str, Any], source: str, step: int) -> None:
        """A change took effect: update the view, settle its policy, suspend overridden ones."""
        self.hparams.update(values)
        for k in values:
            self._changed_at[k] = step
        if source.startswith("policy:"):
            entry = self.entries.get(source[len("policy:"):])
            if entry is not None:
                entry.in_flight, entry.applied_at = False, step
                entry.pending = frozenset()
        if not is_manual(source):
            return
        for entry in self.entries.values():
            hit = sorted(set(entry.policy.drives) & set(values))
            if hit and entry.active:
                entry.suspended = (f"{', '.join(hit)} changed by {source} at step {step}; "
                                   f"enable the policy to hand control back")
                self._notice(entry, "suspended", entry.suspended)

    def settle(self, name: str, error: str | None = None) -> None:
        """The host could not carry a decision out (rejected, or nothing to apply)."""
        entry = self.entries.get(name)
        if entry is None:
            return
        entry.in_flight, entry.pending = False, frozenset()
        if error:
            self._notice(entry, "rejected", error)

    # ---- hooks --------------------------------------------------------------------------------
    def context(self, entry: Entry | None = None, epoch: int | None = None) -> Context:
        return Context(step=self.step, epoch=epoch if epoch is not None else self.epoch or 0,
                       hparams=self.hparams, metrics=self.latest, history=self.history,
                       evals=self.evals, world_size=self.world_size, specs=self.specs,
                       applied_at=entry.applied_at if entry else None)

    def _each(self, hook: str, epoch: int | None = None) -> list[Decision]:
        out: list[Decision] = []
        for entry in list(self.entries.values()):
            if self._ready(entry):
                out += self._call(entry, hook, epoch)
        return out

    def _ready(self, entry: Entry) -> bool:
        if not entry.active or entry.in_flight:
            return False
        busy: set[str] = set()
        for other in self.entries.values():
            busy |= other.pending
        return busy.isdisjoint(entry.policy.drives)

    def _call(self, entry: Entry, hook: str, epoch: int | None = None) -> list[Decision]:
        try:
            change = as_change(getattr(entry.policy, hook)(self.context(entry, epoch)), entry.name)
            if change is not None:
                _check_values(change, entry.name)
        except Exception:
            entry.failed = traceback.format_exc()
            self._notice(entry, "failed", f"{hook} raised; the policy is disabled and the job "
                         "trains on", error=entry.failed)
            return []
        if change is None:
            return []
        entry.in_flight, entry.pending = True, frozenset(change.values)
        entry.decisions += 1
        self._notice(entry, "decided", change.reason, values=dict(change.values),
                     action=change.action, hook=hook)
        return [Decision(entry.name, entry.source, hook, change, self.step)]

    def _notice(self, entry: Entry, status: str, reason: str, **extra: Any) -> None:
        self.notices.append({"kind": "policy", "policy": entry.name, "status": status,
                             "reason": reason, "step": self.step,
                             **{k: v for k, v in extra.items() if v is not None}})

    def take_notices(self) -> list[dict[str, Any]]:
        out, self.notices = self.notices, []
        return out


def _check_values(change: Change, who: str) -> None:
    for k, v in change.values.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidCommand(f"policy {who!r} proposed {k}={v!r}, not a finite number")
