"""The coordinator's cycle (hpinteract/trainer/coordinator.py), with a real coordinator
thread, real ZeroMQ sockets and a real client; the training thread is played by the test:
answers only once logged, and requests that come close together served together while
acknowledgements never wait."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers import until

import hpinteract as hpi
from hpinteract.protocol.hparams import HParam
from hpinteract.protocol.rundir import RunDir
from hpinteract.protocol.states import JobState
from hpinteract.trainer import coordinator as coordinator_module
from hpinteract.trainer import requests as requests_module
from hpinteract.trainer.coordinator import Coordinator
from hpinteract.trainer.store import HParamStore


class Rank0:
    """The training thread's side: takes the pending commands and says they applied."""

    def __init__(self, coord: Coordinator, store: HParamStore) -> None:
        self.coord, self.store, self.step = coord, store, 0

    def status(self, **extra: Any) -> None:
        self.coord.post("status", {
            "hparams": dict(self.store.view), "watched": True,
            "specs": {n: s.to_wire() for n, s in self.store.specs.items()}, **extra})

    def apply_pending(self) -> list[str]:
        cmds = self.coord.take_pending()
        for i, c in enumerate(cmds):
            self.store.apply(c.values, self.step)
            self.coord.post("applied", c, self.step, wake=i == len(cmds) - 1)
        self.step += 1
        return [c.id for c in cmds]


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[hpi.Job, Rank0, RunDir]]:
    run_dir = RunDir.create(root=tmp_path)
    store = HParamStore({"lr": HParam(0.1, low=0.0, high=1.0)})
    coord = Coordinator(run_dir, validate=store.validate, world_size=2)
    coord.start()
    rank0 = Rank0(coord, store)
    coord.post("state", JobState.RUNNING, 0, "job")
    rank0.status()
    try:
        yield hpi.attach(str(run_dir.path)), rank0, run_dir
    finally:
        coord.close(JobState.FINISHED)


def _applier(rank0: Rank0, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.is_set():
            rank0.apply_pending()
            time.sleep(0.005)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def test_an_acknowledged_change_is_already_in_the_events_log_on_disk(job):
    client, rank0, run_dir = job
    stop = threading.Event()
    _applier(rank0, stop)
    try:
        for lr in (0.2, 0.3, 0.4):
            ack = client.set(lr=lr)
            # Read straight from the file, as another process would after its ack.
            events = [json.loads(line) for line in run_dir.events_log.read_text().splitlines()]
            applied = [e for e in events if e.get("kind") == "change"
                       and e.get("status") == "applied" and e["id"] == ack.change_id]
            assert applied and applied[0]["values"] == {"lr": lr}
            assert applied[0]["applied_at_step"] == ack.applied_at_step
    finally:
        stop.set()


class StillClock:
    """The coordinator's ``time`` module with a monotonic clock the test moves: whether the
    gate holds a request is then a matter of order, never of this machine's speed."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def still_clock(monkeypatch) -> StillClock:
    clock = StillClock()
    monkeypatch.setattr(requests_module, "time", clock)
    monkeypatch.setattr(coordinator_module, "time", clock)
    return clock


def test_requests_close_together_wait_for_each_other_and_acks_do_not(job, monkeypatch,
                                                                       still_clock):
    client, rank0, _ = job
    monkeypatch.setattr(requests_module, "REQUEST_GATE_MAX_S", 2.0)
    rank0.status(sync_s=10.0)  # the gate: min(2.0, 0.5 * 10) = 2 s of the coordinator's clock
    pool = ThreadPoolExecutor(2)
    first: Future[hpi.Ack] = pool.submit(client.set, lr=0.2)
    # served at once: nothing came before it
    until(lambda: len(rank0.coord.pending) == 1, 10, poll_s=0.002)
    second: Future[hpi.Ack] = pool.submit(client.set, lr=0.3)
    # The first applies and is acknowledged while the second waits for the gate: had the
    # ack waited for the gate, the second would have been served by the time it came.
    assert rank0.apply_pending()
    assert first.result(timeout=5).values == {"lr": 0.2}
    assert not rank0.coord.pending and not second.done()
    # The coordinator's clock stands still: however many cycles pass, the gate holds.
    time.sleep(0.3)
    assert not rank0.coord.pending
    still_clock.now += 1.9
    time.sleep(0.3)
    assert not rank0.coord.pending  # not yet: 1.9 s of a 2 s gate
    still_clock.now += 0.2
    until(lambda: len(rank0.coord.pending) == 1, timeout=10, poll_s=0.002)
    assert rank0.apply_pending()
    assert second.result(timeout=5).values == {"lr": 0.3}
    pool.shutdown()


def test_without_a_known_sync_interval_requests_are_served_at_once(job, monkeypatch,
                                                                     still_clock):
    client, rank0, _ = job
    monkeypatch.setattr(requests_module, "REQUEST_GATE_MAX_S", 2.0)
    pool = ThreadPoolExecutor(2)
    futures = [pool.submit(client.set, lr=0.2)]
    until(lambda: len(rank0.coord.pending) == 1, 10, poll_s=0.002)
    # The clock stands still: a gate of any length would hold the second for ever.
    futures.append(pool.submit(client.set, lr=0.3))
    until(lambda: len(rank0.coord.pending) == 2, 10, poll_s=0.002)
    rank0.apply_pending()
    assert [f.result(timeout=5).values["lr"] for f in futures] == [0.2, 0.3]
    pool.shutdown()


def test_a_full_disk_does_not_withhold_the_answers(job, caplog):
    client, rank0, _ = job
    stop = threading.Event()
    _applier(rank0, stop)

    def full(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    events = rank0.coord.journal.events
    try:
        events.flush = full  # type: ignore[method-assign]
        acks = [client.set(lr=lr) for lr in (0.5, 0.6)]  # applied: the client is told so
        assert [a.values for a in acks] == [{"lr": 0.5}, {"lr": 0.6}]
        assert acks[0].applied_at_step < acks[1].applied_at_step
        assert "the events log could not be written" in caplog.text
    finally:
        del events.flush  # the disk has room again: the job ends as usual
        stop.set()
