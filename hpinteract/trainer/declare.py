"""Which hyper-parameters a run has, and the rules a change of them must pass.

Runs in: every rank's training thread, once, when ``hpi.init`` makes the Run (the rules
then run in rank 0's coordinator, validating each change).

The script's defaults, a resumed job's effective values on top (a name the script no
longer declares is dropped) and this launch's overrides on top of those; then what every
job declares: the monitors, checkpoints, synchronisation, ``lr_scaling`` with a batch, and
``workers`` at the size this run has, whatever a checkpoint carried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol.errors import InvalidHParam
from ..protocol.hparams import BUILTINS, MONITORS, HParam, build_specs
from .averaging import sync_check
from .batching import BatchStep, batch_constraint
from .resize import workers_check, workers_spec
from .store import Constraint, HParamStore

WhyNot = Callable[[], str | None]


def _no_step() -> dict[str, Any] | None:
    return None


def rules(world: int, resizable: WhyNot, averaging: WhyNot,
          batch_step: BatchStep = _no_step) -> tuple[Constraint, ...]:
    """The checks across names that every job's store has (a coordinator process builds
    them again over the facts rank 0 sends it: see control_process.py)."""
    return (batch_constraint(world, batch_step), workers_check(world, resizable),
            sync_check(averaging))


@dataclass(frozen=True)
class Declared:
    store: HParamStore
    explicit: frozenset[str]  # given by the script, the launch or a checkpoint
    carried: frozenset[str]  # of those, from a checkpoint


def declare(hparams: dict[str, Any], specs: dict[str, HParam], overrides: dict[str, Any],
            saved: dict[str, Any], world: int, devices: int | None, *,
            resizable: WhyNot, averaging: WhyNot, batch_step: BatchStep = _no_step) -> Declared:
    """``saved``: a resumed job's effective values ({} otherwise); ``resizable`` and
    ``averaging`` say why a new ``workers`` or model averaging cannot be had, if so."""
    declared = set(hparams) | set(specs)
    for name in overrides:
        if name not in declared and name not in BUILTINS:
            raise InvalidHParam(
                f"launch override {name!r} is not a hyper-parameter of this script "
                f"(declared: {', '.join(sorted(declared)) or 'none'})", field=name)
    carried = {n: v for n, v in saved.items() if n in declared or n in BUILTINS}
    store = HParamStore(build_specs({**hparams, **carried, **overrides}, specs))
    implied = MONITORS + (("lr_scaling",) if "batch_size" in store.specs else ())
    for name in implied:
        if name not in store.specs:
            store.declare(name, BUILTINS[name])
    store.declare("workers", workers_spec(world, devices))  # a change of it is a resize
    for check in rules(world, resizable, averaging, batch_step):
        store.add_constraint(check)
    if "batch_size" in store.view:
        store.validate({"batch_size": store.view["batch_size"]})
    return Declared(store, frozenset(declared | set(overrides) | set(carried)),
                    frozenset(carried))
