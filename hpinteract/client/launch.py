"""``launch``, ``attach`` and ``jobs``: starting and finding jobs.

Runs in: client processes. ``launch`` writes the job's spec into a fresh owner-only run
directory and starts the supervisor (which runs torchrun) in its own process session, so
closing the notebook does not kill the job.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..protocol.errors import ConfigError, InvalidHParam
from ..protocol.hparams import _kind_of
from ..protocol.rundir import RunDir, atomic_write_json, find_run_dir, iter_run_dirs, read_json
from .job import Job

FUNCTION_FILE = "function.pkl"  # in the run directory: a cell's train(run), pickled


def _write_function(run_dir: RunDir, fn: Callable[..., Any], init: Mapping[str, Any]) -> str:
    """Pickle ``fn`` (by value, with what it references from the notebook) and the
    ``hpi.init`` arguments into the owner-only run directory; the ranks' bootstrap loads
    it from there. It never travels over a socket."""
    import cloudpickle  # here: only function launches need it

    try:
        payload = cloudpickle.dumps({"fn": fn, "init": dict(init)})
    except Exception as exc:
        raise ConfigError(f"cannot send {getattr(fn, '__name__', fn)!r} to the job: "
                          f"pickling it failed ({type(exc).__name__}: {exc}); define what it "
                          "uses inside the function, or use a script") from exc
    path = run_dir.path / FUNCTION_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    return FUNCTION_FILE


def launch(
    script: str | os.PathLike[str] | Callable[..., Any],
    nproc: int = 1,
    hparams: Mapping[str, Any] | None = None,
    args: Sequence[str] = (),
    *,
    backend: str | None = None,
    env: Mapping[str, str] | None = None,
    job_id: str | None = None,
    home: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    init: Mapping[str, Any] | None = None,
) -> Job:
    """Start ``script`` under torchrun with ``nproc`` ranks, detached; returns its Job.

    ``script`` is a path, or a function ``train(run)`` (say, defined in a notebook cell):
    every rank then calls ``hpi.init(hparams=hparams, **init)`` and the function with the
    Run, then finishes the run. ``hparams`` override a script's defaults (validated by the
    job at start-up); ``backend`` forces gloo or nccl (default: nccl with GPUs, else gloo).
    """
    fn = script if callable(script) else None
    if fn is None:
        if init:
            raise ConfigError("init= is for launching a function; a script calls hpi.init "
                              "itself")
        path = Path(script).expanduser().resolve()  # type: ignore[arg-type]
        if not path.is_file():
            raise FileNotFoundError(f"no training script at {path}")
        label, workdir = str(path), cwd or path.parent
    else:
        label = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        workdir = cwd or os.getcwd()  # where the notebook runs: its relative paths work
    if int(nproc) < 1:
        raise ConfigError(f"nproc must be at least 1, got {nproc}")
    overrides = dict(hparams or {})
    for name, value in overrides.items():
        try:
            _kind_of(value)
        except InvalidHParam as exc:
            raise InvalidHParam(f"hparams[{name!r}]: {exc}", field=name) from None
    root = Path(home).expanduser() if home is not None else None
    run_dir = RunDir.create(job_id, root)
    spec: dict[str, Any] = {
        "job_id": run_dir.job_id, "script": label, "args": [str(a) for a in args],
        "nproc": int(nproc), "hparams": overrides, "backend": backend,
        "created": time.time(), "hostname": socket.gethostname(), "python": sys.executable,
    }
    if fn is not None:
        spec["function"] = _write_function(run_dir, fn, init or {})
        spec["cwd"] = str(Path(workdir).resolve())
    atomic_write_json(run_dir.job_file, spec)
    child_env = {**os.environ, **(env or {}), "HPINTERACT_RUN_DIR": str(run_dir.path),
                 "PYTHONUNBUFFERED": "1"}
    if root is not None:
        child_env["HPINTERACT_HOME"] = str(root)
    if backend:
        child_env["HPINTERACT_BACKEND"] = backend
    with open(run_dir.supervisor_log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpinteract.trainer.supervisor", str(run_dir.path)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=str(workdir), env=child_env,
        )
    atomic_write_json(run_dir.job_file, {**spec, "supervisor_pid": proc.pid})
    return Job(run_dir, proc)


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
