"""``Job.stream``: every record of a job once, in order, history first and then live.

Runs in: client processes (a notebook's plots and policies, the CLI's watch). It follows
ZeroMQ's clone pattern (see transport.pubsub.CatchUp): subscribe, page the history in over
the control channel, drop what is not newer and refill gaps; once the job has ended, the
rest comes from the run directory's logs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import zmq

from ..protocol.errors import HpiTimeout, InvalidState, JobFailed
from ..transport.pubsub import CatchUp, Subscriber
from . import history

if TYPE_CHECKING:
    from .job import Job


def stream_records(job: Job, idle_s: float, since: int,
                   stop: threading.Event | None) -> Iterator[dict[str, Any]]:
    stopped = stop.is_set if stop is not None else (lambda: False)
    last = since
    while not job.run_dir.connection.exists() and not job.state.terminal:
        if stopped():
            return
        time.sleep(0.05)
    client = None
    if job.run_dir.connection.exists():
        with contextlib.suppress(InvalidState, JobFailed, HpiTimeout, FileNotFoundError):
            client = job._new_client(timeout=5.0)
    if client is not None and job._info is not None:
        sub = Subscriber(zmq.Context.instance(), job._info.pub_url, job._info.key_bytes)

        def fetch(after: int) -> tuple[list[dict[str, Any]], bool]:
            if job.state.terminal:
                return history.local_page(job.run_dir, after)
            try:
                r = client.request("history", {"since": after}, timeout_s=3.0, retries=0)
            except HpiTimeout:
                return history.local_page(job.run_dir, after)
            return list(r["records"]), bool(r["more"])

        catch = CatchUp(sub, fetch, since)
        try:
            while not stopped():
                yield from catch(idle_s)
                if job.state.terminal:
                    break
        finally:
            sub.close()
            client.close()
        if stopped():
            return
        last = catch.last_seq
    job._wait_supervisor()  # its record of how the job ended comes last
    records, _ = history.local_page(job.run_dir, last)  # what came after the socket closed
    yield from records
