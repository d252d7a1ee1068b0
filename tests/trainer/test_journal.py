"""The journal writes and publishes at most every PUBLISH_EVERY_S however often the
coordinator wakes (under load every request woke a cycle that sent a few records to every
subscriber), tells the coordinator how long it may sleep, and loses nothing at its close."""

from __future__ import annotations

from typing import Any

import pytest

from hpinteract.client.history import read_records
from hpinteract.protocol.rundir import RunDir, read_json
from hpinteract.protocol.states import JobState
from hpinteract.trainer import journal as journal_mod
from hpinteract.trainer.journal import PUBLISH_EVERY_S, STATE_GAP_S, Journal


class Pub:  # the ZeroMQ publisher is tested in tests/transport; here only what is sent
    def __init__(self) -> None:
        self.sent: list[list[dict[str, Any]]] = []

    def publish(self, records: list[dict[str, Any]]) -> None:
        self.sent.append(list(records))


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(journal_mod.time, "monotonic", lambda: now[0])
    return now


def test_cycles_within_the_period_publish_once_and_in_order(tmp_path, clock):
    run_dir = RunDir.create(root=tmp_path)
    pub = Pub()
    j = Journal(run_dir, pub, world_size=2)  # type: ignore[arg-type]
    j.metric({"step": 0, "loss": 1.0})
    j.end_cycle()
    assert [r["step"] for r in pub.sent[0]] == [0]
    for step in (1, 2, 3):  # three wake-ups within the period
        clock[0] += PUBLISH_EVERY_S / 4
        j.metric({"step": step, "loss": 1.0})
        j.end_cycle()
    assert len(pub.sent) == 1
    assert 0 < j.wait_s(0.05) <= PUBLISH_EVERY_S / 4 + 1e-9  # wake up when they are due
    clock[0] += PUBLISH_EVERY_S / 4
    j.end_cycle()
    assert [[r["step"] for r in b] for b in pub.sent] == [[0], [1, 2, 3]]
    assert j.wait_s(0.05) == 0.05  # nothing waiting: the idle poll
    assert [r["step"] for r in read_records(run_dir.metrics_log)] == [0, 1, 2, 3]


def test_a_coordinator_process_publishes_each_link_batch_as_it_comes(tmp_path, clock):
    """Rank 0's link hands metrics over every BATCH_S: the child's own gate is shorter, so
    a batch is not held for a second period on another clock (that doubled the delay)."""
    from hpinteract.trainer.forked import ForkedCoordinator
    from hpinteract.trainer.link import BATCH_S

    pub = Pub()
    j = Journal(RunDir.create(root=tmp_path), pub, world_size=2,  # type: ignore[arg-type]
                publish_every_s=ForkedCoordinator.PUBLISH_EVERY_S)
    for step in range(4):  # a link batch every BATCH_S: each published at once
        if step:
            clock[0] += BATCH_S
        j.metric({"step": step, "loss": 1.0})
        j.end_cycle()
    assert [[r["step"] for r in b] for b in pub.sent] == [[0], [1], [2], [3]]
    clock[0] += BATCH_S / 2  # a wake-up in between (a change applied) waits
    j.metric({"step": 4, "loss": 1.0})
    j.end_cycle()
    assert len(pub.sent) == 4


def test_a_history_page_and_the_close_see_what_is_not_yet_published(tmp_path, clock):
    run_dir = RunDir.create(root=tmp_path)
    pub = Pub()
    j = Journal(run_dir, pub, world_size=1)  # type: ignore[arg-type]
    j.end_cycle()
    j.metric({"step": 0, "loss": 1.0})
    j.event({"kind": "change", "status": "applied", "values": {"lr": 0.1}})
    j.end_cycle()  # within the period: nothing sent yet
    assert pub.sent == []
    records, more = j.page(0, 100)  # a catching-up client is served from the logs
    assert [r["seq"] for r in records] == [1, 2] and not more
    j.close(JobState.FINISHED, None)
    assert [r["seq"] for r in pub.sent[-1]][:2] == [1, 2]
    assert read_json(run_dir.state_file)["state"] == "finished"


def test_a_new_status_reaches_the_state_file_soon_not_at_every_change(tmp_path, clock):
    run_dir = RunDir.create(root=tmp_path)
    j = Journal(run_dir, Pub(), world_size=1)  # type: ignore[arg-type]
    j.write_state()
    for lr in (0.1, 0.2, 0.3):  # a burst of changes
        j.update_status({"hparams": {"lr": lr}})
        j.end_cycle()
    assert read_json(run_dir.state_file)["hparams"] == {}
    clock[0] += STATE_GAP_S + 0.01
    j.end_cycle()
    assert read_json(run_dir.state_file)["hparams"] == {"lr": 0.3}


def test_the_latest_step_shown_to_clients_is_one_already_written(tmp_path, clock):
    run_dir = RunDir.create(root=tmp_path)
    j = Journal(run_dir, Pub(), world_size=2, pid=4242)  # type: ignore[arg-type]
    j.metric({"step": 0, "loss": 1.0})
    j.end_cycle()
    assert j.latest["step"] == 0
    clock[0] += PUBLISH_EVERY_S / 4
    j.metric({"step": 1, "loss": 1.0})
    j.end_cycle()  # within the period: not written yet, so not shown either
    assert j.latest["step"] == 0
    assert [r["step"] for r in read_records(run_dir.metrics_log)] == [0]
    j.flush()  # what a coordinator process does when rank 0 dies
    assert j.latest["step"] == 1
    assert [r["step"] for r in read_records(run_dir.metrics_log)] == [0, 1]
    j.write_state()
    assert read_json(run_dir.state_file)["pid"] == 4242  # rank 0's, not the writer's
