"""``Job``: one API over a running or finished job, for every surface.

Runs in: client processes. Commands go to rank 0's coordinator over the signed control
channel; state, history and logs are read from the run directory, which the job keeps
whether or not anybody is connected, so a restarted kernel re-attaches and loses nothing.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..protocol.connection import ConnectionInfo
from ..protocol.errors import ConfigError, HpiTimeout
from ..protocol.failures import latest_cause
from ..protocol.hparams import HParam
from ..protocol.rundir import RunDir, read_checkpoint_index, read_json
from ..protocol.states import JobState
from ..transport.control import ControlClient
from . import history
from .answers import Ack, JobError
from .channel import Channel, Stamp
from .liveness import job_alive, supervisor_running
from .nodes import node_records
from .policies import ClientPolicies
from .stream import stream_records

if TYPE_CHECKING:
    import pandas as pd


class Job:
    def __init__(self, run_dir: RunDir, process: subprocess.Popen[bytes] | None = None) -> None:
        self.run_dir = run_dir
        self.id = run_dir.job_id
        self._proc = process
        self._channel = Channel(self)  # to the coordinator; stream() opens its own
        self._local: ClientPolicies | None = None  # this process's policies of the job

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.state.value}>"

    # ---- state ---------------------------------------------------------------------------
    @property
    def spec(self) -> dict[str, Any]:
        """What was launched (script, args, nproc, hparam overrides); {} for torchrun jobs."""
        return read_json(self.run_dir.job_file) or {}

    def _status_file(self) -> dict[str, Any]:
        return read_json(self.run_dir.state_file) or {}

    @property
    def state(self) -> JobState:
        st = self._status_file()
        state = JobState(st["state"]) if st.get("state") in JobState._value2member_map_ \
            else JobState.STARTING
        if not state.terminal and not job_alive(lambda: self.spec, self._proc, st,
                                                self._nodes):
            return JobState.FAILED
        return state

    def _supervisor_running(self) -> bool | None:
        return supervisor_running(lambda: self.spec, self._proc, self._nodes)

    def _nodes(self) -> list[dict[str, Any]]:
        """The nodes sharing this run directory (a job on several nodes), if any."""
        return node_records(self.run_dir) if self.run_dir.nodes_dir.is_dir() else []

    @property
    def error(self) -> JobError | None:
        """For a failed job, which rank failed and why."""
        st = self._status_file()
        err = st.get("error")
        if err:
            return JobError.from_record(err)
        if self.state != JobState.FAILED:
            return None  # while failing, the cause is not known yet
        # No supervisor recorded an end (plain torchrun, or a kill -9 of the whole job):
        # what the ranks recorded of their last attempt, if anything.
        found = latest_cause(self.run_dir)
        if found is not None:
            return JobError.from_record(found)
        return JobError(None, "the job's processes exited without recording an end; "
                              "see job.logs()")

    def wait(self, timeout: float | None = None, poll_s: float = 0.1) -> JobState:
        """Block until the job has finished or failed; returns the final state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (state := self.state).terminal:
            if deadline is not None and time.monotonic() > deadline:
                raise HpiTimeout(f"job {self.id} is still {state.value} after {timeout}s")
            time.sleep(poll_s)
        self._wait_supervisor()
        return self.state

    def _wait_supervisor(self, timeout: float = 30.0) -> None:
        """Let the supervisor finish recording the end (the root-cause rank of a failure)."""
        deadline = time.monotonic() + timeout
        while self._supervisor_running() and time.monotonic() < deadline:
            time.sleep(0.05)

    # ---- control ---------------------------------------------------------------------------
    def _request(self, type_: str, content: dict[str, Any] | None = None,
                 command: bool = False) -> dict[str, Any]:
        return self._channel.request(type_, content, command)

    def _open(self, timeout: float) -> tuple[ControlClient, ConnectionInfo, Stamp]:
        return self._channel.open(timeout)

    def set(self, values: dict[str, Any] | None = None, /, *, source: str = "api",
            reason: str | None = None, **kwargs: Any) -> Ack:
        """Change hyper-parameters on every rank at one step; invalid input raises and
        nothing is applied. ``job.set(lr=0.01)`` or ``job.set({"lr": 0.01})``; ``reason``
        is written to the change log next to the change."""
        changes = {**(values or {}), **kwargs}
        content: dict[str, Any] = {"values": changes, "source": source}
        if reason:
            content["reason"] = reason
        r = self._request("set", content, command=True)
        return Ack(r["change_id"], int(r["applied_at_step"]), dict(r.get("values", {})))

    def _command(self, op: str, source: str) -> Ack:
        r = self._request(op, {"source": source}, command=True)
        return Ack(r["change_id"], int(r["applied_at_step"]), {}, r.get("state"), r.get("path"))

    def pause(self, source: str = "api") -> Ack:
        """Hold every rank at the same step boundary."""
        return self._command("pause", source)

    def resume(self, source: str = "api") -> Ack:
        return self._command("resume", source)

    def stop(self, source: str = "api") -> Ack:
        """End every rank's training loop at the same step; the script then finishes."""
        return self._command("stop", source)

    def checkpoint(self, source: str = "api") -> Ack:
        """Save model, optimizer, scheduler, loader position, hyper-parameters, policies and
        the change history at the next step boundary; ``ack.path`` is the file, on disk
        (fsynced) when this returns."""
        return self._command("checkpoint", source)

    def resize(self, workers: int, *, wait: bool = True, timeout: float = 300.0,
               source: str = "api", reason: str | None = None) -> Ack:
        """Change the number of ranks: at the next step boundary the job checkpoints and
        starts again with ``workers`` ranks, the same global batch (micro-batches and
        accumulation planned anew), hyper-parameters, step count and logs. The same as
        ``job.set(workers=n)``, which returns at the boundary; with ``wait`` this returns
        once the resized job has ended its first step (the ``resize`` event then has the
        latency of each phase)."""
        ack = self.set(workers=workers, source=source, reason=reason)
        deadline = time.monotonic() + timeout
        while wait:
            st, state = self._status_file(), self.state
            if st.get("world_size") == workers and state == JobState.RUNNING:
                break
            if state.terminal:
                self._channel.raise_ended(state)
            if time.monotonic() > deadline:
                raise HpiTimeout(f"job {self.id} did not run with {workers} ranks within "
                                 f"{timeout}s of its resize (now {state.value})")
            time.sleep(0.1)
        return ack

    def checkpoints(self) -> list[dict[str, Any]]:
        """The job's checkpoints, oldest first: step, file, whether periodic, time."""
        return [{**e, "path": str(self.run_dir.checkpoints_dir / e["file"])}
                for e in read_checkpoint_index(self.run_dir.checkpoints_dir)]

    def fork(self, step: int, hparams: Mapping[str, Any] | None = None,
             **options: Any) -> Job:
        """A new job from this one's checkpoint at or before ``step``, with ``hparams`` on
        top of the values in force there ("what if I had lowered lr here?"). It counts
        steps on from the checkpoint's, so plots overlay the two (``hpi.compare``); its
        spec's ``parent`` names this job and the step. ``options``: nproc, job_id,
        max_restarts, env. This job may go on running meanwhile."""
        from .launch import fork  # launch imports this module

        return fork(self, step, hparams, **options)

    @property
    def parent(self) -> dict[str, Any] | None:
        """For a fork: ``{"job_id", "step", "asked"}`` of the job it came from."""
        p = self.spec.get("parent")
        return dict(p) if isinstance(p, dict) else None

    def status(self) -> dict[str, Any]:
        """Live status (state, step, epoch, hparams, specs, latest metrics), or the last one
        recorded in the run directory once the job has ended."""
        if self.state.terminal or not self.run_dir.connection.exists():
            return {**self._status_file(), "state": self.state.value}
        return self._request("status")

    def get(self) -> dict[str, Any]:
        """The effective hyper-parameters (the same on every rank)."""
        return dict(self.status().get("hparams", {}))

    @property
    def hparams(self) -> dict[str, Any]:
        return self.get()

    @property
    def specs(self) -> dict[str, HParam]:
        return {n: HParam.from_wire(s) for n, s in self.status().get("specs", {}).items()}

    # ---- history -----------------------------------------------------------------------------
    def metrics(self) -> pd.DataFrame:
        """Every step's metrics so far, one row per step (read from the job's log)."""
        return history.metrics_frame(self.run_dir)

    def evals(self) -> pd.DataFrame:
        """Every evaluation the script reported with ``run.log_eval``, one row each."""
        return history.metrics_frame(self.run_dir, evals=True)

    def events(self) -> pd.DataFrame:
        """The change log: every change with its source, status and step, and state changes."""
        return history.events_frame(self.run_dir)

    def export(self, fmt: str, path: str | Path) -> Path:
        """The history where other tools read it: ``job.export("tensorboard", "runs")``
        writes ``runs/<job id>`` (every metric a scalar, every change a text at its step),
        for ``tensorboard --logdir runs``. Returns the directory written."""
        from .export import export

        return export(self.run_dir, fmt, path)

    def applied_steps(self, change_id: str, timeout: float = 5.0) -> dict[int, int]:
        """{rank: step} at which each rank applied a change (the same step on all ranks).

        Every rank records its own application right after the step-boundary collective;
        the ack comes from rank 0, so another rank's record may trail it by a moment: wait
        up to ``timeout`` for all ranks."""
        world = int(self._status_file().get("world_size") or 1)
        deadline = time.monotonic() + timeout
        while True:
            got = {rank: row["step"] for rank, rows in history.rank_applies(self.run_dir).items()
                   for row in rows if row["id"] == change_id}
            if len(got) >= world or time.monotonic() > deadline:
                return got
            time.sleep(0.02)

    def logs(self, rank: int | None = None) -> str:
        """Combined output of all ranks (rank None), or one rank's stdout and stderr."""
        return "".join(p.read_text(errors="replace") for p in self.log_paths(rank) if p.exists())

    def log_paths(self, rank: int | None = None) -> list[Path]:
        """The files behind ``logs(rank)``."""
        return history.log_paths(self.run_dir, rank)

    def stream(self, idle_s: float = 0.5, since: int = 0,
               stop: threading.Event | None = None) -> Iterator[dict[str, Any]]:
        """Every metric and event record once, in order: history first, then live ones, until
        the job ends (or ``stop`` is set). Records have a ``seq``; metrics a ``step``, events
        a ``kind``."""
        return stream_records(self, idle_s, since, stop)

    # ---- notebook views --------------------------------------------------------------------
    def dashboard(self, **options: Any) -> Any:
        """The control panel and live plots of this job, for a notebook cell: one control
        per hyper-parameter, pause/resume/stop, progress, and plots of every metric that
        keep updating while the kernel stays free. Options: ``metrics`` (names to plot),
        ``smoothing`` (0-0.99), ``log``, ``budget`` (points per line), ``columns``
        (figures a row: 2, 1 for a narrow cell)."""
        return _dashboard()(self, **options)

    def plot(self, metrics: list[str] | None = None, **options: Any) -> Any:
        """Live plots alone (no controls), of ``metrics`` or of everything."""
        return _dashboard()(self, metrics=metrics, controls=False, **options)

    # ---- policies ------------------------------------------------------------------------------
    def add_policy(self, policy: Any, every: int = 1, name: str | None = None,
                   **params: Any) -> str:
        """Run a policy; returns its name. A built-in given by name (``"adaptive_batch"``,
        with JSON parameters) runs inside the job; a Policy object or a function
        ``fn(ctx) -> changes`` runs here, on the streamed metrics, and its changes go
        through ``set`` with source ``policy:<name>``."""
        if isinstance(policy, str):
            r = self._request("add_policy", {"name": policy, "params": params,
                                             "every": every, "alias": name})
            return str(r["policies"][-1]["name"])
        if params:
            raise TypeError(f"parameters {sorted(params)} are for built-ins given by name; "
                            "configure a Policy object before adding it")
        return self._client_policies().add(policy, every, name)

    def policies(self) -> list[dict[str, Any]]:
        """Every policy of this job, in the job and in this process, with its status."""
        here = self._local.describe() if self._local is not None else []
        there: list[dict[str, Any]] = []
        if not self.state.terminal:
            there = [{**p, "where": "job"} for p in self._request("policies")["policies"]]
        return there + here

    def remove_policy(self, name: str) -> None:
        if self._local is not None and name in self._local:
            self._local.remove(name)
        else:
            self._request("remove_policy", {"name": name})

    def enable_policy(self, name: str) -> None:
        """Hand control back to a policy that a manual change suspended (or that failed)."""
        if self._local is not None and name in self._local:
            self._local.enable(name)
        else:
            self._request("enable_policy", {"name": name})

    def _client_policies(self) -> ClientPolicies:
        if self._local is None:
            self._local = ClientPolicies(self)
        return self._local

    def close(self) -> None:
        self._channel.close()


def _dashboard() -> Any:
    """The notebook layer's Dashboard. The one upward import of the client (DESIGN's public
    API puts dashboard() on Job); it happens on call, so the client loads without Bokeh.
    Its packages are dependencies; an environment that lacks one says which, and how."""
    try:
        from ..notebook.dashboard import Dashboard
    except ModuleNotFoundError as e:
        name = (e.name or "?").split(".")[0]
        raise ConfigError(f"job.dashboard() needs {name!r}, which this environment lacks: "
                          f"pip install hpinteract (its dependencies bring it), or "
                          f"pip install {name}") from e
    return Dashboard
