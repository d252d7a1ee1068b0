"""Run directories: where a job keeps its connection file, logs, state and errors.

Runs in: every process. Layout of ``$HPINTERACT_HOME/jobs/<job_id>/`` (owner-only, 0700):

    job.json          launch spec (script, args, nproc, hparam overrides), by the launcher
    connection.json   address, ports, HMAC key, pid (0600), by rank 0's coordinator
    state.json        job state and effective hyper-parameters, rewritten atomically
    metrics.jsonl     one line per step, append-only, by rank 0
    events.jsonl      every change and lifecycle event, append-only, by rank 0
    columns/          the metrics as one binary column per metric (protocol.columns)
    ranks/<r>.jsonl   the changes each rank applied and at which step
    checkpoints/      step-<n>.pt files and index.json (trainer.checkpoint)
    logs/             torchrun's per-rank stdout/stderr and the supervisor's log
    failures/         each attempt's failures: the ranks' own accounts, the agents' view
    nodes/<node>.json each node of a job on several that share this directory
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import JobNotFound

# This node's name, where several nodes of a job share one run directory (its record in
# nodes/, its supervisor's log, its agent's logs): set by hpi.launch for its supervisor.
NODE_ENV = "HPINTERACT_NODE"


def home() -> Path:
    """The root of all run directories: $HPINTERACT_HOME, else the per-user data dir."""
    env = os.environ.get("HPINTERACT_HOME")
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "hpinteract"


def new_job_id() -> str:
    # Sortable by creation time, unique without coordination.
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def atomic_write_json(path: Path, obj: Any, mode: int = 0o600, *,
                      indent: int | None = 1) -> None:
    """Write-then-rename, so a reader never sees half a file; owner-only by default.
    ``indent=None`` writes one compact line, several times faster (json's C encoder does
    not indent): for a file rewritten while the job trains."""
    data = json.dumps(obj, indent=indent, separators=None if indent else (",", ":"))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_checkpoint_index(directory: Path) -> list[dict[str, Any]]:
    """The checkpoints listed in ``directory/index.json``, oldest first (empty if none)."""
    data = read_json(directory / "index.json") or {}
    entries = data.get("checkpoints")
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


class RunDir:
    """Paths of one job's run directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def job_id(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, job_id: str | None = None, root: Path | None = None) -> RunDir:
        jobs_root = (root or home()) / "jobs"
        jobs_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = jobs_root / (job_id or new_job_id())
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
        for sub in ("ranks", "logs"):
            (path / sub).mkdir(mode=0o700)
        return cls(path)

    connection = property(lambda self: self.path / "connection.json")
    job_file = property(lambda self: self.path / "job.json")
    state_file = property(lambda self: self.path / "state.json")
    metrics_log = property(lambda self: self.path / "metrics.jsonl")
    events_log = property(lambda self: self.path / "events.jsonl")
    columns_dir = property(lambda self: self.path / "columns")
    checkpoints_dir = property(lambda self: self.path / "checkpoints")
    logs_dir = property(lambda self: self.path / "logs")
    supervisor_log = property(lambda self: self.path / "logs" / "supervisor.log")
    nodes_dir = property(lambda self: self.path / "nodes")

    def rank_log(self, rank: int) -> Path:
        return self.path / "ranks" / f"{rank}.jsonl"

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"


def iter_run_dirs(root: Path | None = None) -> Iterator[RunDir]:
    """Every run directory under the root, oldest first."""
    jobs_root = (root or home()) / "jobs"
    if not jobs_root.is_dir():
        return
    for p in sorted(jobs_root.iterdir()):
        if p.is_dir() and not p.name.startswith("."):
            yield RunDir(p)


def find_run_dir(job: str, root: Path | None = None) -> RunDir:
    """A job id, a unique id prefix, ``"latest"``, or a run directory path."""
    candidate = Path(job)
    if candidate.is_dir() and any(
        (candidate / name).exists() for name in ("job.json", "connection.json")
    ):
        return RunDir(candidate)
    dirs = list(iter_run_dirs(root))
    if job == "latest":
        if not dirs:
            raise JobNotFound(f"no jobs under {(root or home()) / 'jobs'}")
        return dirs[-1]
    matches = [d for d in dirs if d.job_id == job] or [
        d for d in dirs if d.job_id.startswith(job)
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise JobNotFound(f"no job {job!r} under {(root or home()) / 'jobs'}")
    raise JobNotFound(f"job id {job!r} is ambiguous: {', '.join(d.job_id for d in matches)}")
