"""``launch``, ``attach`` and ``jobs``: starting and finding jobs.

Runs in: client processes. ``launch`` writes the job's spec into a fresh owner-only run
directory and starts the supervisor (which runs torchrun) in its own process session, so
closing the notebook does not kill the job.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..protocol import settings
from ..protocol.errors import ConfigError, InvalidHParam
from ..protocol.hparams import _kind_of
from ..protocol.rundir import (
    NODE_ENV,
    RunDir,
    atomic_write_json,
    find_run_dir,
    read_json,
)
from .job import Job
from .lineage import (
    FUNCTION_FILE,
    copy_into,
    fork_point,
    replay_plan,
    resume_checkpoint,
    resumed_run_dir,
)
from .nodes import new_node_name, node_run_dir, nodes_spec, record_node, resume_node


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
    tmp = path.with_name(f".{FUNCTION_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    os.replace(tmp, path)  # a resumed job may bring a new version of the function
    return FUNCTION_FILE


def launch(
    script: str | os.PathLike[str] | Callable[..., Any] | None = None,
    nproc: int | None = None,
    hparams: Mapping[str, Any] | None = None,
    args: Sequence[str] | None = None,
    *,
    backend: str | None = None,
    env: Mapping[str, str] | None = None,
    job_id: str | None = None,
    home: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    init: Mapping[str, Any] | None = None,
    resume: str | os.PathLike[str] | None = None,
    replay: str | os.PathLike[str] | Job | None = None,
    max_restarts: int | None = None,
    nnodes: int | str | None = None,
    rdzv_endpoint: str | None = None,
    ip: str | None = None,
) -> Job:
    """Start ``script`` under torchrun with ``nproc`` ranks (default 1), detached; its Job.

    ``script`` is a path, or a function ``train(run)`` (say, defined in a notebook cell):
    every rank then calls ``hpi.init(hparams=hparams, **init)`` and the function with the
    Run, then finishes the run. ``hparams`` override a script's defaults (validated by the
    job at start-up); ``backend`` forces gloo or nccl (default: nccl with GPUs, else gloo).

    ``resume`` (a job id, ``"latest"``, a run directory or a checkpoint file) continues an
    ended job from its newest checkpoint (or that file): same run directory, logs and id,
    steps counted on, the saved hyper-parameters in force and ``hparams`` on top of them.

    ``replay`` (a job or its id) runs that job's script again as a new job with the same
    launch values, applies its recorded changes at the steps where they took effect and
    stops it where it was stopped: with fixed seeds on CPU, the same loss at every step.
    Its in-job policies are not started (their decisions are replayed).

    With either, the script, args, nproc, backend and max_restarts default to the job's.
    ``max_restarts`` (default 0): when a rank dies, torchrun restarts the workers up to
    this many times; they continue from the newest checkpoint (set ``checkpoint_every``)
    with the hyper-parameters and change history in force then, and the events log records
    the restart, its cause and the steps lost.

    ``nnodes`` > 1 (or torchrun's elastic ``"MIN:MAX"``): this machine's part of a job on
    several nodes, which meet through torchrun's c10d rendezvous at ``rdzv_endpoint``
    (``host:port``, on one of them). Make the same call, with the same ``job_id``, on every
    node (``nproc`` ranks each). Where the nodes share ``home`` (a network file system) they
    share one run directory, and ``max_restarts`` and an elastic range work: a failure
    restarts every node's ranks from the newest checkpoint, and with ``"MIN:MAX"`` a lost
    node leaves the others going on with the same global batch. ``resume=`` and
    ``replay=`` are the same call on every node too (the first to arrive resumes, the
    others join), and a resize starts ``workers / nnodes`` ranks on each. Where they do not
    share it, each has its own run directory (ranks' logs; the metrics and events logs on
    rank 0's node), a client attaches through any of them, and what needs a shared one
    (restarts, an elastic range, a resize) is refused with the reason.
    ``ip``: the address rank 0's coordinator binds (default 127.0.0.1, this machine only;
    ``0.0.0.0`` for clients on other machines, then encrypted with CurveZMQ and announced
    by host name).
    """
    root = Path(home).expanduser() if home is not None else None
    old: dict[str, Any] = {}
    joined = False  # this node joined the run directory another node of the job made
    if resume is not None and job_id is not None:
        raise ConfigError("a resumed job keeps its id: give resume= or job_id=, not both")
    if resume is not None and replay is not None:
        raise ConfigError("resume= continues a job, replay= starts a new one: not both")
    resumed = resumed_run_dir(resume, root) if resume is not None else None
    extra: dict[str, Any] = nodes_spec(nnodes, rdzv_endpoint,
                                       resumed.job_id if resumed else job_id, ip)
    overrides = _checked_overrides(hparams)
    source = None
    if resumed is not None:
        run_dir = resumed
        if extra.get("nnodes"):  # every node makes this call: the first resumes, others join
            joined = resume_node(run_dir, Job(run_dir).state, str(extra["rdzv_endpoint"]))
        if joined:
            checkpoint = Path((read_json(run_dir.job_file) or {})["resume"]["checkpoint"])
        else:
            assert resume is not None  # resumed is found from it
            checkpoint = resume_checkpoint(run_dir, resume)
        old = read_json(run_dir.job_file) or {}
        extra = {**extra, "created": old.get("created"),
                 "resumes": int(old.get("resumes", 0)) + 1,
                 "resume": {"checkpoint": str(checkpoint), "at": time.time()}}
    elif replay is not None:
        source = replay.run_dir if isinstance(replay, Job) else find_run_dir(str(replay), root)
        old = read_json(source.job_file) or {}
        overrides = {**old.get("hparams", {}), **overrides}  # its launch values, then these
        extra = {**extra, "replay": replay_plan(source)}
    if resumed is None and extra.get("nnodes"):  # maybe one run directory for all nodes
        run_dir, joined = node_run_dir(str(job_id), root, extra)
    elif resumed is None:
        run_dir = RunDir.create(job_id, root)
    if extra.get("nnodes"):
        extra["node"] = new_node_name()
    try:
        return _launch_spec(run_dir, old, extra, script, nproc, overrides, args, backend,
                            env, root, cwd, init, max_restarts, source, joined)
    except BaseException:
        if resumed is None and not joined:  # nothing started: leave no empty job behind
            shutil.rmtree(run_dir.path, ignore_errors=True)
        raise


def fork(parent: Job, step: int, hparams: Mapping[str, Any] | None = None, *,
         nproc: int | None = None, job_id: str | None = None,
         max_restarts: int | None = None, env: Mapping[str, str] | None = None) -> Job:
    """A new job from ``parent``'s checkpoint at or before ``step``, with ``hparams`` on top
    of the values in force there (see ``Job.fork``)."""
    overrides = _checked_overrides(hparams)
    entry = fork_point(parent.run_dir, step)
    root = parent.run_dir.path.parent.parent  # a sibling of the parent's run directory
    run_dir = RunDir.create(job_id, root)
    try:
        # A copy of its own: the parent may drop its periodic checkpoints meanwhile.
        checkpoint = copy_into(parent.run_dir.checkpoints_dir / entry["file"], run_dir,
                               f"forked-{entry['file']}")
        extra = {"resume": {"checkpoint": str(checkpoint), "at": time.time()},
                 "parent": {"job_id": parent.id, "step": int(entry["step"]), "asked": step}}
        return _launch_spec(run_dir, parent.spec, extra, None, nproc, overrides, None, None,
                            env, root, None, None, max_restarts, parent.run_dir, False)
    except BaseException:  # nothing started: leave no empty job behind
        shutil.rmtree(run_dir.path, ignore_errors=True)
        raise


def _launch_spec(
    run_dir: RunDir, old: dict[str, Any], extra: dict[str, Any],
    script: str | os.PathLike[str] | Callable[..., Any] | None, nproc: int | None,
    overrides: dict[str, Any], args: Sequence[str] | None, backend: str | None,
    env: Mapping[str, str] | None, root: Path | None, cwd: str | os.PathLike[str] | None,
    init: Mapping[str, Any] | None, max_restarts: int | None, source: RunDir | None,
    joined: bool,
) -> Job:
    """The new job's spec written into ``run_dir``, and the job started. ``old``: the spec
    of the job it comes from, whose values are the defaults; ``source``: the run directory
    whose pickled function a replay or a fork runs again."""
    script = script if script is not None else old.get("script")
    if script is None:
        raise ConfigError(f"job {old['job_id']} records no script: pass it again" if old
                          else "launch what? give a script path or a function")
    fn = script if callable(script) else None
    function_file = None
    if fn is None:
        if init:
            raise ConfigError("init= is for launching a function; a script calls hpi.init "
                              "itself")
        path = Path(script).expanduser().resolve()  # type: ignore[arg-type]
        if old.get("function") and str(script) == old.get("script"):
            label, workdir = str(script), cwd or old.get("cwd") or os.getcwd()
            function_file = old["function"]  # the cell's function, pickled the first time
            if source is not None:
                copy_into(source.path / function_file, run_dir, function_file)
        elif not path.is_file():
            raise FileNotFoundError(f"no training script at {path}")
        else:
            label, workdir = str(path), cwd or path.parent
    else:
        label = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        workdir = cwd or os.getcwd()  # where the notebook runs: its relative paths work
    n = int(nproc if nproc is not None else old.get("nproc", 1))
    if n < 1:
        raise ConfigError(f"nproc must be at least 1, got {n}")
    restarts = int(max_restarts if max_restarts is not None else old.get("max_restarts", 0))
    if restarts < 0:
        raise ConfigError(f"max_restarts must be 0 or more, got {restarts}")
    spec: dict[str, Any] = {
        "job_id": run_dir.job_id, "script": label,
        "args": [str(a) for a in (args if args is not None else old.get("args", []))],
        "nproc": n, "hparams": overrides, "backend": backend or old.get("backend"),
        "created": time.time(), "hostname": socket.gethostname(), "python": sys.executable,
        "max_restarts": restarts,
        **{k: v for k, v in extra.items() if v is not None},
    }
    if fn is not None:
        spec["function"] = _write_function(run_dir, fn, init or {})
    elif function_file is not None:
        spec["function"] = function_file
    if "function" in spec:
        spec["cwd"] = str(Path(workdir).resolve())
    return _start(run_dir, spec, env, root, spec["backend"], workdir, joined)


def _checked_overrides(hparams: Mapping[str, Any] | None) -> dict[str, Any]:
    overrides = dict(hparams or {})
    for name, value in overrides.items():
        try:
            _kind_of(value)
        except InvalidHParam as exc:
            raise InvalidHParam(f"hparams[{name!r}]: {exc}", field=name) from None
    return overrides


def _start(run_dir: RunDir, spec: dict[str, Any], env: Mapping[str, str] | None,
           root: Path | None, backend: str | None, workdir: Any, joined: bool) -> Job:
    """Write the spec and start the supervisor (which runs torchrun) in its own session.
    A node that ``joined`` another's run directory keeps that node's spec."""
    settings.check({**os.environ, **(env or {})})  # a typo is an error here, not a failed job
    if not joined:
        atomic_write_json(run_dir.job_file, spec)
    if "resume" in spec and not joined:  # the ended job's state and address are not this run's
        with contextlib.suppress(FileNotFoundError):
            os.unlink(run_dir.connection)
        atomic_write_json(run_dir.state_file, {"job_id": run_dir.job_id, "state": "starting",
                                               "updated": time.time()})
    child_env = {**os.environ, **(env or {}), "HPINTERACT_RUN_DIR": str(run_dir.path),
                 "PYTHONUNBUFFERED": "1"}
    if root is not None:
        child_env["HPINTERACT_HOME"] = str(root)
    if backend:
        child_env["HPINTERACT_BACKEND"] = backend
    if spec.get("ip"):
        child_env["HPINTERACT_IP"] = str(spec["ip"])
    node = spec.get("node")
    log = run_dir.supervisor_log
    if node:
        child_env[NODE_ENV] = str(node)
        log = run_dir.logs_dir / f"supervisor-{node}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpinteract.trainer.supervisor", str(run_dir.path)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=str(workdir), env=child_env,
        )
    if node:
        record_node(run_dir, str(node), proc.pid)
    if not joined:
        atomic_write_json(run_dir.job_file, {**spec, "supervisor_pid": proc.pid})
    return Job(run_dir, proc)
