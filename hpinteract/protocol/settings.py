"""Environment settings of a job that both the launching client and rank 0 read.

Runs in: a client process (``hpi.launch`` checks them before anything starts, so a typo is
an error at the call, not a failed job) and rank 0 (which reads them when its run starts:
a job started by torchrun directly is checked there). What they do is the trainer's
(control_process.py, forked.py); only their names and checks live here.
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import ConfigError

COORDINATOR = "HPINTERACT_COORDINATOR"  # where rank 0's coordinator runs
COORDINATOR_MODES = ("thread", "process")  # the first is the default
COORDINATOR_NICE = "HPINTERACT_COORDINATOR_NICE"  # how far below the ranks a process runs
DEFAULT_NICE = 10


def coordinator_mode(env: Mapping[str, str]) -> str:
    """``thread`` (the default: a thread of rank 0) or ``process`` (a forked child of it)."""
    mode = env.get(COORDINATOR, "").strip().lower() or COORDINATOR_MODES[0]
    if mode not in COORDINATOR_MODES:
        raise ConfigError(f"{COORDINATOR}={mode!r}: expected one of "
                          f"{', '.join(COORDINATOR_MODES)}")
    return mode


def coordinator_nice(env: Mapping[str, str]) -> int:
    """How many steps of CPU priority below rank 0 a coordinator process runs, 0 to 19."""
    raw = env.get(COORDINATOR_NICE, "").strip()
    if not raw:
        return DEFAULT_NICE
    try:
        nice = int(raw)
    except ValueError:
        nice = -1
    if not 0 <= nice <= 19:
        raise ConfigError(f"{COORDINATOR_NICE}={raw!r}: expected a whole number from 0 to 19")
    return nice


def check(env: Mapping[str, str]) -> None:
    """Raise ConfigError for the first setting in ``env`` that is not valid."""
    coordinator_mode(env)
    coordinator_nice(env)
