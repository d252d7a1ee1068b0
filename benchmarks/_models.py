"""The benchmarks' two digits models, shared by train.py and monitor_floor.py.

Runs in: whichever process builds the model (a rank of train.py, or monitor_floor.py's
single process). Imports torch, unlike _common.py, which the driver processes import.
"""

from __future__ import annotations

import torch
from torch import nn

SEED = 0


def build(kind: str, hidden: int = 512) -> nn.Module:
    """``mlp``: 64-hidden-hidden-10 (about 300k weights, 300k multiply-adds a sample: the
    least compute per weight); ``cnn``: two 3x3 convolutions over the 8x8 image and a linear
    head (60k weights, 1.2M multiply-adds a sample: a convolution's weights are used at
    every position). Built from the same seed, so every run starts from the same weights."""
    torch.manual_seed(SEED)
    if kind == "cnn":
        return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 32, 3, padding=1),
                             nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                             nn.Flatten(), nn.Linear(64 * 64, 10))
    if kind == "mlp":
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                             nn.ReLU(), nn.Linear(hidden, 10))
    raise ValueError(f"unknown model {kind!r}: mlp or cnn")
