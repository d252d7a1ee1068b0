"""Policies: hooks that read a job's metrics and return changes, the host that runs them, and
the built-ins (``create("adaptive_batch", {"max_batch": 1024})``).

Runs in: whichever process hosts it: rank 0's coordinator for built-ins, or a client.
Torch-free and zmq-free.
"""

from __future__ import annotations

from .base import Change, Context, FunctionPolicy, Policy
from .builtins import REGISTRY, AdaptiveBatchSize, DivergenceGuard, create
from .goodput import Goodput
from .host import PolicySet
from .plateau import EarlyStopping, ReduceOnPlateau
from .resources import ScaleWorkers
from .schedules import Schedule, Warmup

__all__ = [
    "REGISTRY",
    "AdaptiveBatchSize",
    "Change",
    "Context",
    "DivergenceGuard",
    "EarlyStopping",
    "FunctionPolicy",
    "Goodput",
    "Policy",
    "PolicySet",
    "ReduceOnPlateau",
    "ScaleWorkers",
    "Schedule",
    "Warmup",
    "create",
]
