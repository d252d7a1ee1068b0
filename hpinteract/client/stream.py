"""``Job.stream``: every record of a job once, in order, history first and then live.

Runs in: client processes (a notebook's plots and policies, the CLI's watch). It follows
ZeroMQ's clone pattern (see transport.pubsub.CatchUp): subscribe, page the history in over
the control channel, drop what is not newer and refill gaps; once the job has ended, the
rest comes from the run directory's logs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import zmq

from ..protocol.connection import connection_stamp
from ..protocol.errors import HpiTimeout, InvalidState, JobFailed
from ..transport.pubsub import CatchUp, Subscriber
from . import history

if TYPE_CHECKING:
    from .job import Job


def stream_records(job: Job, idle_s: float, since: int,
                   stop: threading.Event | None) -> Iterator[dict[str, Any]]:
    stopped = stop.is_set if stop is not None else (lambda: False)
    last = since
    while not stopped():
        while not job.run_dir.connection.exists() and not job.state.terminal:
            if stopped():
                return
            time.sleep(0.05)
        live = _Follow(job, idle_s, last, stopped)
        yield from live
        last = live.last_seq
        if job.state.terminal or not live.moved:
            break
        # torchrun restarted the workers: a new coordinator, new ports and key.
    if stopped():
        return
    job._wait_supervisor()  # its record of how the job ended comes last
    records, _ = history.local_page(job.run_dir, last)  # after the socket closed
    yield from records


class _Follow:
    """Records from one coordinator until the job ends, or the connection file changes
    (a restarted job's new coordinator), or ``stopped``."""

    def __init__(self, job: Job, idle_s: float, since: int, stopped: Callable[[], bool]):
        self.job, self.idle_s, self.last_seq, self.stopped = job, idle_s, since, stopped
        self.moved = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        job = self.job
        try:
            client, info, stamp = job._open(timeout=5.0)
        except (InvalidState, JobFailed, HpiTimeout, FileNotFoundError):
            return
        sub = Subscriber(zmq.Context.instance(), info.pub_url, info.key_bytes,
                         info.server_key)

        def fetch(after: int) -> tuple[list[dict[str, Any]], bool, int]:
            if job.state.terminal:  # its logs are complete
                records, more = history.local_page(job.run_dir, after)
                return records, more, records[-1]["seq"] if records else after
            try:
                r = client.request("history", {"since": after}, timeout_s=3.0, retries=0)
            except HpiTimeout:  # its logs are read instead; a hole there may be unflushed
                return (*history.local_page(job.run_dir, after), 0)
            # The coordinator flushes before it pages: its log is complete up to its head.
            return list(r["records"]), bool(r["more"]), int(r.get("head", 0))

        catch = CatchUp(sub, fetch, self.last_seq)
        try:
            while not self.stopped():
                yield from catch(self.idle_s)
                self.last_seq = catch.last_seq
                if job.state.terminal:
                    break
                if connection_stamp(job.run_dir.connection) not in (stamp, None):
                    self.moved = True
                    break
        finally:
            self.last_seq = catch.last_seq
            sub.close()
            client.close()
