"""Synchronisation as a hyper-parameter: ``sync`` = ``ssgd`` | ``model_averaging``.

Runs in: every rank's training thread (the switch at a step boundary, the averaging after an
optimizer step); rank 0's coordinator (the constraint, when a change is validated).

- ``ssgd``: DDP as the script made it, its gradient all-reduce in every backward.
- ``model_averaging`` (CROSSBOW's and KungFu's model averaging; post-local SGD): every rank
  steps on its own gradient, and every ``averaging_period`` steps the ranks' parameters are
  averaged with torch's ``model_averaging.utils.average_parameters`` (what its
  ``PeriodicModelAverager`` calls), on the training process group.

The gradient all-reduce is switched off the way DDP's own ``no_sync()`` does it, through
``require_backward_grad_sync``, rather than with the post-local-SGD comm hook: a comm hook
puts a Python call per bucket on every backward of every job, even one that never leaves
ssgd, and DDP cannot unregister it. Back to ssgd, the ranks first agree: parameters and
the optimizer's state (momentum buffers, which drifted apart with the local steps) are
averaged, so that synchronous SGD goes on from one model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.utils import average_parameters

from ..protocol.errors import InvalidHParam


def sync_check(why_not: Callable[[], str | None]) -> Callable[
        [dict[str, Any], Mapping[str, Any]], None]:
    """A store constraint: model averaging needs a DDP model in ``run.watch``."""

    def check(changes: dict[str, Any], merged: Mapping[str, Any]) -> None:
        if changes.get("sync") == "model_averaging" and (reason := why_not()):
            raise InvalidHParam(f"cannot use model averaging: {reason}", field="sync")

    return check


def is_ddp(model: Any) -> bool:
    return hasattr(model, "require_backward_grad_sync") and hasattr(model, "no_sync")


class SyncControl:
    """A Run's ``sync``: what the watched DDP model and its optimizer do between steps."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.model: Any = None  # the watched DDP model (None: not watched, or not DDP)
        self.optimizer: Any = None
        self.averaging = False  # read on every step: one attribute, no call, in ssgd

    def why_not(self, binding: Any) -> str | None:
        """Rank 0, for validation (see Run._facts): why model averaging cannot be had, if so."""
        if binding is None:
            return "the script has not called run.watch(model, optimizer)"
        if self.model is None:
            return "the model given to run.watch is not a DistributedDataParallel"
        return None

    def watch(self, model: Any, optimizer: Any, mode: str) -> bool:
        """At ``run.watch``: whether the model can average (then ``mode`` is in force)."""
        if not is_ddp(model):
            return False
        self.model, self.optimizer = model, optimizer
        self.switch(mode)
        return True

    def on_change(self, changed: dict[str, Any]) -> None:
        """The store's effect, every rank at the same step boundary."""
        if "sync" in changed:
            self.switch(str(changed["sync"]))

    def gns_every(self, hp: Mapping[str, Any]) -> int:
        # The noise scale compares a rank's gradient with the all-reduced one: with model
        # averaging there is no all-reduced gradient to compare with.
        return 0 if self.averaging else int(hp["monitor_gns"])

    def switch(self, mode: str) -> None:
        local = mode == "model_averaging"
        if local == self.averaging or self.model is None:
            return
        if not local:  # leaving: one model and one optimizer state again, on every rank
            self.average()
            self.average_optimizer_state()
        self.averaging = local
        self.model.require_backward_grad_sync = not local

    def after_step(self, step: int, period: int) -> None:
        """Every rank, after the optimizer step of ``step``, while averaging."""
        if (step + 1) % period == 0:
            self.average()

    def average(self) -> None:
        if self.world > 1:
            average_parameters(iter([p for p in self.model.parameters() if p.requires_grad]),
                               dist.group.WORLD)

    def average_optimizer_state(self) -> None:
        if self.world == 1 or self.optimizer is None:
            return
        # The state tensors in parameter order, which every rank shares (same model).
        tensors = [t for group in self.optimizer.param_groups for p in group["params"]
                   for t in self.optimizer.state.get(p, {}).values()
                   if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() > 0]
        if not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        flat /= self.world
        dist.all_reduce(flat)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
