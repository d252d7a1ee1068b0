"""Where a new job comes from: the job and checkpoint a resume, a fork or a replay uses.

Runs in: client processes, inside ``hpi.launch`` and ``Job.fork``. Nothing here starts a
process: it reads run directories (the parent's spec, checkpoint index and events log) and
says what the new job's spec must carry, which the ranks then act on (trainer/resume.py,
trainer/replay.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..protocol.changes import recorded_changes
from ..protocol.errors import ConfigError, InvalidState
from ..protocol.rundir import RunDir, find_run_dir, read_checkpoint_index
from .history import read_records
from .job import Job

FUNCTION_FILE = "function.pkl"  # in the run directory: a cell's train(run), pickled


def resumed_run_dir(what: str | os.PathLike[str], root: Path | None) -> RunDir:
    """The run directory ``resume=`` names (a job id, ``"latest"``, a run directory or a
    checkpoint file in one), whatever its state."""
    p = Path(what).expanduser()
    if p.is_file():  # a checkpoint file: checkpoints/step-<n>.pt inside a run directory
        run_dir = RunDir(p.resolve().parent.parent)
        if not run_dir.job_file.exists():
            raise ConfigError(f"{p} is not in a job's checkpoints/ directory")
        return run_dir
    return find_run_dir(str(what), root)


def resume_checkpoint(run_dir: RunDir, what: str | os.PathLike[str]) -> Path:
    """The checkpoint file ``resume=what`` names in ``run_dir`` (found by resumed_run_dir):
    the file given, else the job's newest; the job must have ended."""
    p = Path(what).expanduser()
    state = Job(run_dir).state
    if not state.terminal:
        raise InvalidState(f"job {run_dir.job_id} is {state.value}: stop it (and wait for "
                           "it to end) before resuming it")
    if p.is_file():
        return p.resolve()
    index = read_checkpoint_index(run_dir.checkpoints_dir)
    if not index:
        raise ConfigError(f"job {run_dir.job_id} has no checkpoint to resume from "
                          "(job.checkpoint(), or set checkpoint_every)")
    return Path(run_dir.checkpoints_dir, str(index[-1]["file"]))


def fork_point(parent: RunDir, step: int) -> dict[str, Any]:
    """The parent's newest checkpoint at or before ``step`` (its index entry)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"fork step must be a step number (an int >= 0), got {step!r}")
    index = read_checkpoint_index(parent.checkpoints_dir)
    before = [e for e in index if int(e["step"]) <= step]
    if not before:
        have = ", ".join(str(e["step"]) for e in index) or "none"
        raise ConfigError(f"job {parent.job_id} has no checkpoint at or before step {step} "
                          f"(checkpoints at steps: {have}; job.checkpoint() keeps one, "
                          "checkpoint_every keeps the newest two)")
    return before[-1]


def copy_into(src: Path, run_dir: RunDir, name: str) -> Path:
    """A private copy in the new job's directory: the parent may delete its periodic
    checkpoints (or be removed) while the new job still needs the file."""
    dest = run_dir.path / name
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o600)
    os.replace(tmp, dest)
    return dest


def replay_plan(run_dir: RunDir) -> dict[str, Any]:
    """What a replay applies (see protocol/changes.py): the job's applied changes at the
    steps where they took effect, and the step where it was stopped."""
    return {"of": run_dir.job_id, **recorded_changes(read_records(run_dir.events_log))}
