"""lr_scaling: how the learning rate follows a batch-size change, whoever makes it.

Runs in: rank 0's training thread, at a sync point, on the commands about to be handed to
every rank: a change of batch_size is followed by an lr change of its own (source
``lr_scaling``, with the reason), applied at the same step. Rank 0 computes the value once,
so every rank receives the same number rather than recomputing it.

With s = B_new / B_old: linear lr*s (Goyal et al.), sqrt lr*sqrt(s) (Adam-type optimisers),
adascale lr*(1 + B_simple/B_old)/(1 + B_simple/B_new), the ratio of AdaScale's gains
r(B) = (sigma^2 + mu^2)/(sigma^2 B0/B + mu^2) at the two sizes, with B_simple from the
noise-scale monitor (Johnson et al. 2020): linear while the noise dominates, flat once the
gradient does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..protocol.hparams import HParam
from ..protocol.messages import new_id
from .commands import Command


def scaled_lr(rule: str, lr: float, old: int, new: int,
              b_simple: float | None) -> tuple[float | None, str]:
    """(new lr or None to keep it, why)."""
    s = new / old
    if rule == "linear":
        return lr * s, f"linear: x{s:g}"
    if rule == "sqrt":
        return lr * math.sqrt(s), f"sqrt: x{math.sqrt(s):.4g}"
    if rule == "adascale":
        if b_simple is None or not math.isfinite(b_simple) or b_simple <= 0:
            return None, "adascale: no positive noise-scale estimate yet (monitor_gns), lr kept"
        gain = (1 + b_simple / old) / (1 + b_simple / new)
        return lr * gain, f"adascale with noise scale {b_simple:.4g}: x{gain:.4g}"
    return None, ""


def with_lr_scaling(
    cmds: list[Command], hp: Mapping[str, Any], specs: Mapping[str, HParam],
    b_simple: Callable[[], float | None],
) -> list[Command]:
    """``cmds`` with an lr_scaling command after each batch change that does not set lr."""
    if "lr" not in hp or "batch_size" not in hp:
        return cmds
    out: list[Command] = []
    batch, lr, rule = int(hp["batch_size"]), float(hp["lr"]), str(hp.get("lr_scaling", "none"))
    for cmd in cmds:
        out.append(cmd)
        if cmd.op != "set":
            continue
        rule = str(cmd.values.get("lr_scaling", rule))
        if "lr" in cmd.values:
            lr = float(cmd.values["lr"])
        new_batch = int(cmd.values.get("batch_size", batch))
        if new_batch != batch and "lr" not in cmd.values and rule != "none":
            new_lr, why = scaled_lr(rule, lr, batch, new_batch, b_simple())
            reason = f"batch_size {batch} -> {new_batch} ({why})"
            if new_lr is not None:
                new_lr = _clip(new_lr, specs["lr"])
                reason += f": lr {lr:.6g} -> {new_lr:.6g}"
                out.append(Command("set", new_id(), "lr_scaling", {"lr": new_lr}, None,
                                   reason=reason, tracked=False))
                lr = new_lr
        batch = new_batch
    return out


def _clip(lr: float, spec: HParam) -> float:
    if spec.low is not None:
        lr = max(lr, float(spec.low))
    if spec.high is not None:
        lr = min(lr, float(spec.high))
    return lr
