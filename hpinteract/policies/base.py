"""The ``Policy`` contract: hooks that read a job's metrics and *return* changes.

Runs in: whichever process hosts the policy: rank 0's coordinator for built-ins (see
``hpinteract.trainer.policy_host``), or a client process for a notebook's own policy (see
``hpinteract.client.policies``). Torch-free: monitors hand policies plain numbers. A policy
never applies anything itself; its host sends what it returns through the job's one
consistent path, so every rank applies it at the same step.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ..protocol.errors import InvalidCommand

Action = Literal["stop", "rollback"]


@dataclass(frozen=True)
class Change:
    """What a hook asks for: new hyper-parameter values, or an action, with a reason.

    ``action="stop"`` ends the job (EarlyStopping); ``action="rollback"`` restores the job's
    last good in-memory snapshot (at or before ``to_step``) and then applies ``values``
    (DivergenceGuard). The reason is written to the job's events next to the change.
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    action: Action | None = None
    to_step: int | None = None

    def __post_init__(self) -> None:
        if self.action not in (None, "stop", "rollback"):
            raise InvalidCommand(f"unknown policy action {self.action!r} (stop or rollback)")
        object.__setattr__(self, "values", dict(self.values))


@dataclass(frozen=True)
class Context:
    """What a hook sees. Everything is read-only and describes the job as its host knows it.

    ``metrics`` holds the newest value of every training metric (``step``, ``loss``, ``lr``,
    ``batch_size``, and with the noise-scale monitor on ``gns``, ``grad_norm``,
    ``gns_grad_sq``, ``gns_var``): the newest record's, and for a metric that record lacks
    (the noise scale is published every few steps) the last one published;
    ``history`` the last records, oldest first; ``evals`` the last records of
    ``run.log_eval`` (each with ``step`` and the evaluation's own names). Records of steps
    before ``applied_at`` were made before the policy's last change took effect.
    """

    step: int
    epoch: int
    hparams: Mapping[str, Any]
    metrics: Mapping[str, Any]
    history: Sequence[Mapping[str, Any]] = ()
    evals: Sequence[Mapping[str, Any]] = ()
    world_size: int = 1
    specs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    applied_at: int | None = None  # the step at which this policy's last change took effect

    def __post_init__(self) -> None:
        object.__setattr__(self, "hparams", MappingProxyType(dict(self.hparams)))
        object.__setattr__(self, "metrics", MappingProxyType(dict(self.metrics)))
        object.__setattr__(self, "history", tuple(self.history))
        object.__setattr__(self, "evals", tuple(self.evals))

    def series(self, name: str) -> list[float]:
        """The finite-or-not values of ``name`` in ``history``, oldest first."""
        return [r[name] for r in self.history if isinstance(r.get(name), int | float)]


Result = Change | Mapping[str, Any] | None


class Policy:
    """Base class of every policy: override the hooks you need; each may return a change.

    ``drives`` names the hyper-parameters the policy changes: a manual change of one of them
    suspends the policy until it is re-enabled (a person's decision wins). ``name`` defaults
    to the class name in snake case.
    """

    name: str = ""
    drives: tuple[str, ...] = ()

    def on_start(self, ctx: Context) -> Result:
        """Called once, when the policy is added, with the job's current state."""
        return None

    def on_step(self, ctx: Context) -> Result:
        """Called every ``every`` steps with the newest metrics."""
        return None

    def on_epoch_end(self, ctx: Context) -> Result:
        """Called when an epoch ends; ``ctx.epoch`` is the epoch that ended."""
        return None

    def on_eval(self, ctx: Context) -> Result:
        """Called when the job reports evaluation metrics (``ctx.evals[-1]``)."""
        return None

    def report(self) -> Mapping[str, float]:
        """What the policy measures, as numbers: a built-in's are added to the job's metric
        records (named by the policy, e.g. ``goodput_efficiency``) and shown by
        ``job.policies()``."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state, saved with checkpoints."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    @property
    def policy_name(self) -> str:
        return self.name or snake_case(type(self).__name__)


class FunctionPolicy(Policy):
    """A plain function ``fn(ctx) -> change`` used as a policy's ``on_step``."""

    def __init__(self, fn: Callable[[Context], Result], name: str | None = None,
                 drives: Sequence[str] = ()) -> None:
        self.fn = fn
        self.name = name or str(getattr(fn, "__name__", "function"))
        self.drives = tuple(drives)

    def on_step(self, ctx: Context) -> Result:
        return self.fn(ctx)


def as_change(result: Any, who: str) -> Change | None:
    """A hook's return value as a Change, or InvalidCommand saying what was wrong with it."""
    if result is None:
        return None
    if isinstance(result, Change):
        return result if result.values or result.action else None
    if isinstance(result, Mapping):
        if not all(isinstance(k, str) for k in result):
            raise InvalidCommand(f"policy {who!r} returned non-string hyper-parameter names")
        return Change(values=dict(result)) if result else None
    raise InvalidCommand(f"policy {who!r} returned {type(result).__name__}: return a dict of "
                         "changes, a Change, or None")


def snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
