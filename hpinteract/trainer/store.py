"""The effective hyper-parameters of one rank, and the rules a change must pass.

Runs in: every rank's training thread (apply) and rank 0's coordinator (validate; a
coordinator process validates with a ``mirror`` of rank 0's store). Validation reads only
the specs and the constraints, which change solely on the training thread by whole-dict
replacement, so the two threads never see a half-updated view.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..protocol.hparams import HParam, validate_changes

log = logging.getLogger(__name__)

Constraint = Callable[[dict[str, Any], Mapping[str, Any]], None]  # (changes, current) -> raise


class HParamStore:
    def __init__(self, specs: dict[str, HParam]) -> None:
        self.specs: dict[str, HParam] = dict(specs)
        self._values: dict[str, Any] = {n: s.default for n, s in specs.items()}
        self.view: Mapping[str, Any] = MappingProxyType(self._values)
        self.versions: dict[str, int] = dict.fromkeys(specs, 0)
        self.last_changed: dict[str, int] = {}
        self._constraints: tuple[Constraint, ...] = ()
        self._effects: tuple[Callable[[dict[str, Any]], None], ...] = ()

    def declare(self, name: str, spec: HParam) -> None:
        """Add a hyper-parameter after init (e.g. lr read from a watched optimizer)."""
        specs = dict(self.specs)
        specs[name] = spec
        self._values[name] = spec.default
        self.versions.setdefault(name, 0)
        self.specs = specs

    def add_constraint(self, check: Constraint) -> None:
        self._constraints = (*self._constraints, check)

    def mirror(self, values: Mapping[str, Any], specs: Mapping[str, Any],
               rules: tuple[Constraint, ...]) -> None:
        """Become a copy for validation only: rank 0's values and specs (as in its status)
        and ``rules`` in place of the constraints; no effect runs here. A coordinator
        process validates with such a copy (control_process.py)."""
        self.specs = {n: HParam.from_wire(w) for n, w in specs.items()}
        self._values.clear()
        self._values.update(values)
        self._constraints = rules

    def add_effect(self, effect: Callable[[dict[str, Any]], None]) -> None:
        """``effect(changed)`` runs on every rank after values change (optimizer, loader)."""
        self._effects = (*self._effects, effect)

    def validate(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Coerced values, or InvalidHParam naming the field; nothing is changed here."""
        values = validate_changes(self.specs, changes)
        current = dict(self._values)
        merged = {**current, **values}
        for check in self._constraints:
            check(values, merged)
        return values

    def apply(self, changes: Mapping[str, Any], step: int) -> dict[str, Any]:
        """Set already-validated values and run the effects; returns {name: (old, new)}."""
        diff: dict[str, Any] = {}
        for name, new in changes.items():
            old = self._values.get(name)
            self._values[name] = new
            self.versions[name] = self.versions.get(name, 0) + 1
            self.last_changed[name] = step
            diff[name] = (old, new)
        for effect in self._effects:
            effect(dict(changes))
        for name, (old, new) in diff.items():
            cb = self.specs[name].on_change
            if cb is not None:
                cb(name, old, new)
        return diff

