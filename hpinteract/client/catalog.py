"""Finding existing jobs: ``attach`` one by id, prefix, path or "latest"; list them all.

Runs in: client processes. It reads run directories only (a finished job's, or a running
one's on this machine); a Job it returns talks to the job's coordinator when asked to.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from ..protocol.rundir import find_run_dir, iter_run_dirs, read_json
from .job import Job


def attach(job: str = "latest", *, home: str | os.PathLike[str] | None = None) -> Job:
    """A Job for an existing run: its id, a unique id prefix, ``"latest"`` or its path."""
    return Job(find_run_dir(job, Path(home).expanduser() if home is not None else None))


class JobSummary(NamedTuple):
    id: str
    state: str
    script: str
    nproc: int | None
    step: int | None
    created: float | None


def jobs(*, home: str | os.PathLike[str] | None = None) -> list[JobSummary]:
    """Every job under the home directory, oldest first, with its state."""
    out = []
    for rd in iter_run_dirs(Path(home).expanduser() if home is not None else None):
        job = Job(rd)
        spec = job.spec
        st = read_json(rd.state_file) or {}
        out.append(JobSummary(rd.job_id, job.state.value, spec.get("script", "?"),
                              spec.get("nproc", st.get("world_size")), st.get("step"),
                              spec.get("created")))
    return out
