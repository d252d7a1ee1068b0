"""What the JupyterLab panel asks of jobs, as plain data: no Tornado here.

Runs in: the Jupyter server process (blocking calls, run off its event loop by the
handlers). Everything goes through the client's ``Job`` API, like every other surface:
the browser never reaches a job's sockets, and a job's own validation errors come back
unchanged (typed, with the field they name) for the handlers to turn into 4xx replies.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..client import Job
from ..client.bulk import load_history
from ..client.decimate import minmax
from ..client.history import read_records
from ..protocol.errors import InvalidCommand, InvalidHParam
from ..protocol.hparams import SYSTEM
from ..protocol.rundir import RunDir, find_run_dir, iter_run_dirs, read_json

COMMANDS = ("pause", "resume", "stop", "checkpoint")
# What the panel's chart draws; a request may name others.
CHART = ("loss", "lr", "acc", "accuracy", "val_loss", "batch_size", "gns")
CHART_POINTS = 1000  # per metric in the first message (min/max decimated: spikes kept)
EVENTS = 50  # the newest events a job's detail carries
SOURCE = "lab"  # how the panel's changes are recorded in a job's events


def finite(v: Any) -> Any:
    """JSON has no NaN or inf: a diverged loss is sent as null, not as invalid JSON."""
    return v if not isinstance(v, float) or math.isfinite(v) else None


class Jobs:
    """The jobs under one home directory, each attached once and shared by requests."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str) -> Job:
        """The job of this id (JobNotFound if none: a 404). Only ids, never paths: a request
        cannot point the server at a directory of its choosing."""
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise InvalidCommand(f"not a job id: {job_id!r}")
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                rd = find_run_dir(job_id, self.home)
                if rd.job_id != job_id:  # find_run_dir also takes prefixes
                    raise InvalidCommand(f"give the whole job id, not {job_id!r}")
                job = self._jobs[job_id] = Job(rd)
            return job

    def summaries(self) -> list[dict[str, Any]]:
        """Every job, newest first: what the side panel lists. Ended jobs' connections are
        let go here (the panel polls this), so a long-lived server holds sockets only to
        jobs that still run."""
        out = [summary(Job(rd)) for rd in reversed(list(iter_run_dirs(self.home)))]
        ended = {s["id"] for s in out if s["state"] in ("finished", "failed")}
        with self._lock:
            for job_id in ended & set(self._jobs):
                self._jobs.pop(job_id).close()
        return out

    def close(self) -> None:
        with self._lock:
            for job in self._jobs.values():
                job.close()
            self._jobs.clear()


def summary(job: Job) -> dict[str, Any]:
    """From the run directory only (no request to the job): cheap enough to list many."""
    st = read_json(job.run_dir.state_file) or {}
    spec = job.spec
    latest = st.get("latest") or {}
    err = job.error
    return {
        "id": job.id, "state": job.state.value, "script": spec.get("script"),
        "nproc": spec.get("nproc", st.get("world_size")), "created": spec.get("created"),
        "step": st.get("step"), "epoch": st.get("epoch"), "epochs": st.get("epochs"),
        "progress": finite(latest.get("progress")), "loss": finite(latest.get("loss")),
        "updated": st.get("updated"),
        "error": None if err is None else {"rank": err.rank, "message": err.message},
    }


def detail(job: Job) -> dict[str, Any]:
    """One job: its summary, live status, specs, the newest events and its checkpoints."""
    st = job.status()
    events = job.run_dir.events_log
    return {
        **summary(job),
        "hparams": {k: finite(v) for k, v in (st.get("hparams") or {}).items()},
        "specs": st.get("specs") or {},
        # hpinteract's own knobs, which the panel groups apart (as the dashboard does)
        "system": sorted(SYSTEM & set(st.get("specs") or {})),
        "last_changed": st.get("last_changed") or {},
        "latest": {k: finite(v) for k, v in (st.get("latest") or {}).items()},
        "events": read_records(events)[-EVENTS:],
        "checkpoints": job.checkpoints(),
    }


def set_hparams(job: Job, body: Any) -> dict[str, Any]:
    """``{"values": {name: value}}`` -> the acknowledgement; the job validates the values
    and refuses by name (``InvalidHParam``): nothing is applied then."""
    values = body.get("values") if isinstance(body, dict) else None
    if not isinstance(values, dict) or not values:
        raise InvalidHParam('expected a JSON object {"values": {"name": value, ...}}')
    reason = body.get("reason")
    ack = job.set(values, source=SOURCE, reason=reason if isinstance(reason, str) else None)
    return {"change_id": ack.change_id, "applied_at_step": ack.applied_at_step,
            "values": ack.values}


def command(job: Job, op: str) -> dict[str, Any]:
    if op not in COMMANDS:
        raise InvalidCommand(f"unknown command {op!r}; one of {', '.join(COMMANDS)}")
    ack = getattr(job, op)(source=SOURCE)
    return {"change_id": ack.change_id, "applied_at_step": ack.applied_at_step,
            "state": ack.state, "path": ack.path}


def chart_history(run_dir: RunDir, names: tuple[str, ...] = CHART,
                  points: int = CHART_POINTS) -> dict[str, Any]:
    """The chart's first message: each metric decimated to ``points`` (first, last and
    every spike kept), the change events for its markers, and the seq the live stream
    continues after, so nothing is shown twice or missed."""
    hist = load_history(run_dir)
    metrics: dict[str, dict[str, list[Any]]] = {}
    for name in names:
        if name not in hist.columns:
            continue
        xs, ys = hist.columns[name]
        idx = minmax(ys, max(1, points // 2 - 1)) if len(ys) > points else np.arange(len(ys))
        metrics[name] = {"x": [int(x) for x in xs[idx]],
                         "y": [finite(float(y)) for y in ys[idx]]}
    return {"type": "history", "metrics": metrics, "count": hist.count,
            "events": hist.events[-500:], "seq": hist.last_seq}


def chart_record(rec: dict[str, Any], names: tuple[str, ...] = CHART) -> dict[str, Any] | None:
    """A live metric record cut to what the chart draws (None if it draws nothing of it)."""
    if rec.get("eval") and "loss" in rec:  # an evaluation's loss is val_loss on the chart
        rec = {**rec, "val_loss": rec["loss"]}
        del rec["loss"]
    out = {k: finite(rec[k]) for k in names if isinstance(rec.get(k), int | float)}
    if not out or not isinstance(rec.get("step"), int):
        return None
    return {"step": rec["step"], **out}
