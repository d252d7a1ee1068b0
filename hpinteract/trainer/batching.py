"""How the global batch maps onto ranks, micro-batches and gradient accumulation.

Runs in: every rank's training thread (the loader's plan, ``run.backward``) and rank 0's
coordinator (the constraint, when a change is validated).

``batch_size`` is the global batch, whatever the number of ranks. Without ``micro_batch``
each rank takes ``batch_size / world`` samples in one forward/backward; with it, the rank's
share is split into ``accumulation = batch_size / (micro_batch * world)`` micro-batches
whose gradients are summed (weighted by their sizes) before the one all-reduce. Either way
a step's gradient is the mean over the same global batch of samples, so one rank with four
micro-batches and two ranks with two compute the same update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..protocol.errors import InvalidHParam
from .store import Constraint


def plan_of(hp: Mapping[str, Any], world: int) -> tuple[int, int]:
    """(micro_batch, accumulation steps) for the current values (already validated)."""
    local = int(hp["batch_size"]) // world
    micro = int(hp.get("micro_batch") or local) or 1
    return micro, max(1, local // micro)


# A framework's own unit of the global batch (trainer/driven.py), or None: {"unit": the
# global batch changes in multiples of it, "why": what makes it so}.
BatchStep = Callable[[], "dict[str, Any] | None"]


def batch_constraint(default_world: int, batch_step: BatchStep | None = None) -> Constraint:
    """Rejects a batch_size/micro_batch that cannot be split evenly, naming what would; with
    a new ``workers`` (a resize) the split over that many ranks is what must work."""

    def check(changes: dict[str, Any], merged: Mapping[str, Any]) -> None:
        if not {"batch_size", "micro_batch", "workers"} & changes.keys() \
                or "batch_size" not in merged:
            return
        world = int(changes.get("workers", default_world))
        b = int(merged["batch_size"])
        rule = batch_step() if batch_step is not None else None
        if rule and b % int(rule["unit"]):
            unit = int(rule["unit"])
            lower = max(unit, b - b % unit)
            raise InvalidHParam(
                f"batch_size={b}: {rule['why']}, so the global batch is a multiple of "
                f"{unit} (e.g. {lower} or {lower + unit})", field="batch_size")
        if b % world:
            field = "workers" if "batch_size" not in changes else "batch_size"
            raise InvalidHParam(
                f"batch_size={b} cannot be shared by {world} ranks: use a multiple of "
                f"{world} (e.g. {max(world, b - b % world)})", field=field)
        m = merged.get("micro_batch")
        if m is None:
            return
        local, unit = b // world, int(m) * world
        if local % int(m):
            name = next(n for n in ("batch_size", "micro_batch", "workers") if n in changes)
            lower = max(unit, b - b % unit)
            raise InvalidHParam(
                f"batch_size={b} on {world} rank(s) is {local} samples per rank, which "
                f"micro_batch={m} does not divide: use a batch_size that is a multiple of "
                f"{unit} (e.g. {lower} or {lower + unit}), or a micro_batch that divides "
                f"{local}", field=name)

    return check


def micro_chunks(indices: list[int], micro: int) -> list[list[int]]:
    return [indices[i : i + micro] for i in range(0, len(indices), micro)]
