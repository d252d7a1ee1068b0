"""The metric record of a step: reserved names and the conversion of user values.

Runs in: every rank's training thread (rank 0 builds the records; the coordinator thread,
or the link thread that sends them to a coordinator process, reads device tensors later,
so that no device sync happens on the training loop).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from ..protocol.errors import ConfigError

# Fields hpinteract writes into records; a user metric of the same name would corrupt the
# stream (per-rank times are step_time_r<N> and data_time_r<N>).
RESERVED = frozenset({
    "seq", "kind", "step", "epoch", "time", "eval", "lr", "batch_size", "samples_per_s",
    "step_time", "data_time", "progress", "grad_norm", "gns", "gns_grad_sq", "gns_var",
    "straggler",
})


def user_metrics(metrics: Mapping[str, Any], also: frozenset[str] = frozenset()) -> \
        dict[str, Any]:
    """The user's metrics converted for a record, or ConfigError naming a clash."""
    clash = sorted((RESERVED | also) & metrics.keys()) + sorted(
        k for k in metrics if k.startswith(("step_time_r", "data_time_r")))
    if clash:
        raise ConfigError(f"metric names {clash} are hpinteract's own: rename them "
                          "(e.g. train_lr, or val_loss for an evaluation)")
    return {k: scalar(k, v) for k, v in metrics.items()}


def scalar(name: str, v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ConfigError(f"metric {name!r} must be a scalar, got a tensor of shape "
                              f"{tuple(v.shape)}")
        if v.device.type == "cpu":
            return v.item()  # now: an accumulator updated in place must not report later
        # A device tensor is copied asynchronously (no sync) and read by the coordinator.
        return v.detach().clone()
    if isinstance(v, int | float | str | bool) or v is None:
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"metric {name!r} must be a number or a string, got "
                          f"{type(v).__name__}") from None


def step_record(step: int, epoch: int, step_time: float, data_time: float, loss: Any,
                metrics: Mapping[str, Any], lr: float | None, batch_size: Any,
                progress: float | None) -> dict[str, Any]:
    """Rank 0's record of one step: hpinteract's fields, then the user's metrics."""
    rec: dict[str, Any] = {"step": step, "epoch": epoch, "time": time.time()}
    if loss is not None:
        rec["loss"] = scalar("loss", loss)
    rec.update(user_metrics(metrics) if metrics else ())
    if lr is not None:
        rec["lr"] = lr
    if batch_size is not None:
        rec["batch_size"] = batch_size
        rec["samples_per_s"] = batch_size / step_time if step_time > 0 else None
    rec["step_time"], rec["data_time"] = step_time, data_time
    if progress is not None:
        rec["progress"] = progress
    return rec
