"""The job's record: metrics and events logs, their columnar copy, the state file, and the
publisher that streams what was logged.

Runs in: rank 0's coordinator, which owns it. Records get a sequence number shared
by both logs (a late subscriber pages the history in by seq, then drops what it already
has). What was logged is written before it is published, at most 20 times a second
(however many requests wake the coordinator): ``metrics()`` sees what the stream showed,
and a crash loses nothing a client has seen. Writes, not fsyncs: the hot path stays free
of disk waits.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..protocol.columns import ColumnWriter
from ..protocol.rundir import RunDir, atomic_write_json
from ..protocol.states import JobState
from ..transport.pubsub import Publisher
from .runlog import RunLog, merge_pages

STATE_EVERY_S = 2.0  # the state file is rewritten at least this often (progress, latest)
# ... and at most this often for a new status: under 100 set()s a second a rewrite per
# change was half of the coordinator's time. A live job's status is asked of the job.
STATE_GAP_S = 0.25
# The columnar copy is for opening a long history fast; what it lacks is read from the JSON
# log or the stream after its watermark. Once a second: its dozen files and watermark were
# a quarter of the coordinator's time under load when written every 50 ms cycle.
COLUMNS_EVERY_S = 1.0
# The logs are written and the stream published at most this often (20 times a second, as
# an idle cycle does): under load every request woke a cycle, and each cycle sent its
# handful of records to every subscriber (16 of them: the zmq I/O thread's CPU) and wrote
# them (a syscall per log). Events are written sooner when a cycle answers a client (the
# coordinator writes them before it sends its answers).
PUBLISH_EVERY_S = 0.05


class Journal:
    def __init__(self, run_dir: RunDir, pub: Publisher, world_size: int,
                 pid: int | None = None, publish_every_s: float = PUBLISH_EVERY_S) -> None:
        self.pid = pid if pid is not None else os.getpid()  # rank 0's, for the state file
        self.run_dir = run_dir
        self.world_size = world_size
        self._pub = pub
        self.metrics = RunLog(run_dir.metrics_log)
        self.columns = ColumnWriter(run_dir.columns_dir)  # for fast opening
        self.events = RunLog(run_dir.events_log)
        self.seq = max(self.metrics.last_seq, self.events.last_seq)
        self.state = JobState.STARTING
        self.status: dict[str, Any] = {"step": 0, "epoch": 0, "hparams": {}, "specs": {}}
        self.latest: dict[str, Any] = {}  # the newest training record written
        self._latest_new: dict[str, Any] | None = None  # a newer one, not yet written
        self.changes: list[dict[str, Any]] = []  # applied changes, saved with checkpoints
        # The policies' measurements (Policy.report), added to each training record.
        self.annotations: dict[str, float] = {}
        self._batch: list[dict[str, Any]] = []  # records to publish at the end of this cycle
        self._fresh: list[dict[str, Any]] = []  # metric records of this cycle, for policies
        self._last_state_write = 0.0
        self._status_new = False
        self._columns_at = 0.0
        self._published_at = 0.0
        self._publish_every = publish_every_s

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def metric(self, record: dict[str, Any]) -> None:
        # Tensors were detached on the training thread; reading them here keeps any device
        # sync off the training loop.
        rec: dict[str, Any] = {"seq": self._next_seq()}
        for k, v in record.items():
            rec[k] = v if isinstance(v, int | float | str | bool) or v is None else float(v)
        if self.annotations and not rec.get("eval"):
            for k, v in self.annotations.items():  # never over the script's own metric
                rec.setdefault(k, v)
        self.metrics.append(rec)
        self.columns.add(rec)
        self._batch.append(rec)
        self._fresh.append(rec)
        if rec.get("eval"):
            return  # an evaluation: not the latest training step
        self._latest_new = rec
        self.status["step"] = int(record.get("step", 0)) + 1
        self.status["epoch"] = rec.get("epoch", 0)

    def event(self, event: dict[str, Any]) -> None:
        rec = {"seq": self._next_seq(), "time": time.time(), **event}
        self.events.append(rec)
        if event.get("kind") == "change" and event.get("status") == "applied":
            self.changes.append(rec)
        # Written before any answer of this cycle is sent (RequestDesk._send_answers: a
        # client may read the log right after its ack), else with the cycle's publication.
        self._batch.append(rec)

    def take_fresh(self) -> list[dict[str, Any]]:
        fresh, self._fresh = self._fresh, []
        return fresh

    def set_state(self, state: JobState, step: int, source: str) -> bool:
        """Record a new state (an event and the state file); False if it is not new."""
        if state == self.state:
            return False
        self.state = state
        self.event({"kind": "state", "state": state.value, "step": step, "source": source})
        self.events.flush()  # a reader of the state file finds the event in the log too
        self.write_state()
        return True

    def update_status(self, status: dict[str, Any]) -> None:
        """The training thread's news (hparams, specs, plan): to the state file soon."""
        self.status.update(status)
        self._status_new = True

    def write_state(self, error: dict[str, Any] | None = None) -> None:
        self._last_state_write = time.monotonic()
        self._status_new = False
        atomic_write_json(self.run_dir.state_file, {
            "job_id": self.run_dir.job_id, "state": self.state.value, "pid": self.pid,
            "world_size": self.world_size, "updated": time.time(), "error": error,
            "latest": self.latest, **self.status,
        }, indent=None)  # rewritten up to 4 times a second under load: compact

    def page(self, since: int, limit: int) -> tuple[list[dict[str, Any]], bool]:
        return merge_pages([self.metrics, self.events], since, limit)

    def end_cycle(self) -> None:
        """Write what the cycles since the last publication logged, then publish it, when
        ``publish_every_s`` has passed (``wait_s`` tells the coordinator when that will be)."""
        now = time.monotonic()
        if now - self._published_at >= self._publish_every:
            self._published_at = now
            self._flushed()
            if now - self._columns_at > COLUMNS_EVERY_S:
                self._columns_at = now
                self.columns.flush()  # after the log it indexes
            self.publish()
        since = now - self._last_state_write
        if since > STATE_EVERY_S or (self._status_new and since > STATE_GAP_S):
            self.write_state()

    def flush(self) -> None:
        """Write and publish what is buffered, and not the state file: rank 0 died, and the
        supervisor records that (a state written now could overwrite its)."""
        self._flushed()
        self.columns.flush()
        self.publish()

    def _flushed(self) -> None:
        self.metrics.flush()
        self.events.flush()
        # A client is told of a step only once its record is written: what it has seen, a
        # kill -9 of the whole job keeps (in the kernel's page cache).
        if self._latest_new is not None:
            self.latest, self._latest_new = self._latest_new, None

    def wait_s(self, idle_s: float) -> float:
        """How long the coordinator may wait for news: ``idle_s``, or less when records are
        waiting for their publication."""
        if not self._batch:
            return idle_s
        return min(idle_s, max(0.0, self._published_at + self._publish_every - time.monotonic()))

    def publish(self) -> None:
        if self._batch:
            self._pub.publish(self._batch)
            self._batch = []

    def close(self, state: JobState, error: dict[str, Any] | None) -> None:
        self._flushed()  # every step is on disk before the state says the job ended
        self.columns.flush()
        self.set_state(state, self.status.get("step", 0), "job")
        self.write_state(error)
        self.publish()
        self.metrics.close()
        self.columns.close()
        self.events.close()
