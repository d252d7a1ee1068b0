"""Hyper-parameter specs and their validation.

Runs in: rank 0 (validates every command before it is queued), the ranks (declare specs)
and clients (show specs, pre-check values). Torch-free, so that widgets and the CLI can use
the same rules that the job enforces.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import InvalidHParam

OnChange = Callable[[str, Any, Any], None]
KINDS = ("bool", "int", "float", "str")


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    raise InvalidHParam(
        f"unsupported hyper-parameter type {type(value).__name__}: use bool, int, float or str"
    )


@dataclass(frozen=True)
class HParam:
    """Declares one hyper-parameter: its default, bounds, choices and documentation.

    ``low``/``high`` are inclusive bounds for numbers; ``choices`` restricts the value to a
    set; ``log`` tells widgets to use a log scale; ``on_change(name, old, new)`` is called
    on every rank when a change takes effect, at the same step. ``fixed`` says why a value
    cannot change in this job (a framework that reads it only once): every change of it is
    refused with that reason, and widgets show it read-only.
    """

    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    log: bool = False
    doc: str = ""
    on_change: OnChange | None = field(default=None, compare=False, repr=False)
    kind: str = ""
    fixed: str = ""

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", _kind_of(self.default))
        elif self.kind not in KINDS:
            raise InvalidHParam(f"kind must be one of {KINDS}, not {self.kind!r}")
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))
        if self.low is not None and self.high is not None and self.low > self.high:
            raise InvalidHParam(f"low ({self.low}) is above high ({self.high})")

    def validate(self, name: str, value: Any) -> Any:
        """The value coerced to this spec's kind, or InvalidHParam naming ``name`` and why."""
        v = self._coerce(name, value)
        if self.fixed and v != self.default:
            raise InvalidHParam(f"{name} cannot change in this job: {self.fixed}", field=name)
        if self.choices is not None and v not in self.choices:
            raise InvalidHParam(
                f"{name}={v!r} is not one of the allowed values {list(self.choices)}", field=name
            )
        if self.kind in ("int", "float"):
            if self.low is not None and v < self.low:
                raise InvalidHParam(f"{name}={v!r} is below the minimum {self.low}", field=name)
            if self.high is not None and v > self.high:
                raise InvalidHParam(f"{name}={v!r} is above the maximum {self.high}", field=name)
        return v

    def _coerce(self, name: str, value: Any) -> Any:
        got = type(value).__name__
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
        elif self.kind == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                return int(value)
        elif self.kind == "float":
            if isinstance(value, int | float) and not isinstance(value, bool):
                try:  # an int too large for a float (10**400) overflows: not finite either
                    ok = math.isfinite(value)
                except OverflowError:
                    ok = False
                if not ok:
                    raise InvalidHParam(f"{name}={str(value)[:40]} is not a finite number",
                                        field=name)
                return float(value)
        elif isinstance(value, str):
            return value
        raise InvalidHParam(f"{name} must be {self.kind}, got {got} {value!r}", field=name)

    def with_default(self, value: Any, name: str) -> HParam:
        return replace(self, default=self.validate(name, value))

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "default": self.default,
            "low": self.low,
            "high": self.high,
            "choices": list(self.choices) if self.choices is not None else None,
            "log": self.log,
            "doc": self.doc,
            "fixed": self.fixed,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> HParam:
        choices = data.get("choices")
        return cls(
            default=data["default"],
            low=data.get("low"),
            high=data.get("high"),
            choices=tuple(choices) if choices is not None else None,
            log=bool(data.get("log", False)),
            doc=str(data.get("doc", "")),
            kind=str(data.get("kind", "")),
            fixed=str(data.get("fixed") or ""),
        )


# Built-in hyper-parameters: their meaning is fixed, so are their sane bounds.
BUILTINS: dict[str, HParam] = {
    "lr": HParam(0.01, low=0.0, log=True, doc="learning rate (every param group, ratios kept)"),
    "momentum": HParam(0.0, low=0.0, high=1.0, doc="SGD momentum, or Adam's beta1"),
    "weight_decay": HParam(0.0, low=0.0, doc="weight decay of the groups that decay"),
    "batch_size": HParam(32, low=1, doc="global batch: samples per step over all ranks"),
    "micro_batch": HParam(8, low=1, doc="samples per rank and forward/backward (a memory "
                          "bound); accumulation steps = batch_size / (micro_batch x ranks)"),
    "lr_scaling": HParam("none", choices=("none", "linear", "sqrt", "adascale"),
                         doc="how lr follows a batch_size change, whoever makes it"),
    "monitor_gns": HParam(0, low=0, doc="gradient noise scale monitor: every N steps (0: off)"),
    # 0.99: a single step's estimate is very noisy (the two batch sizes differ only by the
    # number of ranks); about the last hundred measurements count.
    "gns_smoothing": HParam(0.99, low=0.0, high=0.9999,
                            doc="EMA factor of the noise-scale monitor's two sums"),
    "monitor_ranks": HParam(100, low=0, doc="per-rank step and data-wait times: every N "
                            "steps (0: off)"),
    "checkpoint_every": HParam(0, low=0, doc="write a checkpoint every N steps (0: only "
                               "when asked); the newest two periodic ones are kept"),
    # As NCCL's default collective timeout: long enough for any step that finishes.
    "hang_timeout": HParam(600.0, low=0.0, doc="seconds without a completed step (not "
                           "paused) after which the job dumps every rank's stack and fails "
                           "as hung (0: off)"),
    "sync": HParam("ssgd", choices=("ssgd", "model_averaging"),
                   doc="ssgd: gradients all-reduced every step; model_averaging: local steps, "
                       "parameters averaged every averaging_period steps"),
    "averaging_period": HParam(4, low=1, doc="steps between model averages (sync="
                               "model_averaging)"),
}
# Declared in every job (the monitors, checkpoints, synchronisation) or with batch_size (its
# scaling rule).
MONITORS = ("monitor_gns", "gns_smoothing", "monitor_ranks", "checkpoint_every", "sync",
            "averaging_period", "hang_timeout")
# hpinteract's own knobs (how the job runs, not what it learns): the views group them
# apart from the script's hyper-parameters, folded until opened.
SYSTEM = frozenset({*MONITORS, "lr_scaling", "micro_batch", "workers"})


def build_specs(
    hparams: Mapping[str, Any], specs: Mapping[str, HParam] | None = None
) -> dict[str, HParam]:
    """Specs for every declared name: explicit specs, built-ins, or inferred from the value."""
    out: dict[str, HParam] = {}
    for name, spec in (specs or {}).items():
        if not isinstance(spec, HParam):
            raise InvalidHParam(f"specs[{name!r}] must be an HParam, got {type(spec).__name__}")
        out[name] = spec
    for name, value in hparams.items():
        if isinstance(value, HParam):
            out[name] = value
        elif name in out:
            out[name] = out[name].with_default(value, name)
        elif name in BUILTINS:
            out[name] = BUILTINS[name].with_default(value, name)
        else:
            out[name] = HParam(value)
    return out


def validate_changes(specs: Mapping[str, HParam], changes: Mapping[str, Any]) -> dict[str, Any]:
    """All changes coerced and checked, or InvalidHParam for the first bad one (none applied)."""
    if not changes:
        raise InvalidHParam("no hyper-parameter values given")
    out: dict[str, Any] = {}
    for name, value in changes.items():
        spec = specs.get(name)
        if spec is None:
            hint = difflib.get_close_matches(name, list(specs), n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else ""
            known = ", ".join(sorted(specs)) or "none"
            raise InvalidHParam(
                f"unknown hyper-parameter {name!r}{extra} (known: {known})", field=name
            )
        out[name] = spec.validate(name, value)
    return out
