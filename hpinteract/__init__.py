"""hpinteract: tune a running distributed PyTorch training job from Jupyter.

Runs in: any process. Importing the package does not import torch: ``hpi.init`` (for the
training script) loads the trainer on first use, so a notebook that only attaches to jobs
stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import Ack, Job, JobError, JobSummary, attach, jobs, launch
from .protocol.errors import (
    AuthError,
    ConfigError,
    HpiError,
    HpiTimeout,
    InvalidCommand,
    InvalidHParam,
    InvalidState,
    JobFailed,
    JobNotFound,
    ProtocolError,
)
from .protocol.hparams import HParam
from .protocol.states import JobState

if TYPE_CHECKING:
    from .trainer.run import Run

__version__ = "0.1.0"


def init(*args: Any, **kwargs: Any) -> Run:
    """Start hpinteract in a training script (every rank); see ``hpinteract.trainer.start``."""
    from .trainer.start import init as _init

    return _init(*args, **kwargs)


def compare(jobs: Any, metric: str = "loss", **options: Any) -> Any:
    """Overlay one metric of several jobs in a live figure (notebook)."""
    from .notebook.compare import compare as _compare

    return _compare(jobs, metric, **options)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext hpinteract``: the ``%hp`` magics."""
    from .notebook.magics import load

    load(ipython)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The Jupyter server extension; the installed jupyter-config file enables it."""
    return [{"module": "hpinteract.server"}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The JupyterLab extension built into the package (also installed as shared data)."""
    return [{"src": "labextension", "dest": "hpinteract"}]


__all__ = [
    "Ack", "AuthError", "ConfigError", "HParam", "HpiError", "HpiTimeout", "InvalidCommand",
    "InvalidHParam", "InvalidState", "Job", "JobError", "JobFailed", "JobNotFound", "JobState",
    "JobSummary", "ProtocolError", "attach", "compare", "init", "jobs", "launch",
]
