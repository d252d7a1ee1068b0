"""The pieces of a resize below the live job (tests/client/test_resize.py runs it): the
record the leaving rank 0 hands to the supervisor, the check of a new ``workers``, and the
latency event's arithmetic."""

from __future__ import annotations

import json

import pytest

from hpinteract.protocol.errors import InvalidHParam
from hpinteract.protocol.rundir import RunDir
from hpinteract.trainer import resize, restart


def test_the_record_is_taken_once_and_a_malformed_one_is_no_resize(tmp_path):
    run_dir = RunDir.create(root=tmp_path)
    resize.write_record(run_dir, {"from": 2, "to": 4, "step": 30})
    assert (run_dir.path / resize.RECORD).stat().st_mode & 0o777 == 0o600
    assert resize.take_record(run_dir) == {"from": 2, "to": 4, "step": 30}
    assert resize.take_record(run_dir) is None  # a later clean end is the end
    for bad in ({"to": 0}, {"to": "4"}, {"from": 2}):
        resize.write_record(run_dir, bad)
        assert resize.take_record(run_dir) is None
        assert not (run_dir.path / resize.RECORD).exists()


def test_a_new_size_needs_a_resizable_job():
    check = resize.workers_check(2, lambda: "it runs on several nodes")
    check({"workers": 2}, {})  # the same size: nothing to do, nothing to refuse
    check({"lr": 0.1}, {})
    with pytest.raises(InvalidHParam, match="cannot resize this job: it runs on several") as e:
        check({"workers": 4}, {})
    assert e.value.field == "workers"
    resize.workers_check(2, lambda: None)({"workers": 4}, {})
    spec = resize.workers_spec(2, None)
    assert (spec.default, spec.low, spec.high) == (2, 1, resize.CPU_MAX)
    assert resize.workers_spec(3, 2).high == 3  # never below the size it runs at


def test_the_done_event_splits_the_latency_into_phases(monkeypatch):
    record = {"from": 1, "to": 2, "boundary": 100.0, "left": 100.5, "relaunched": 101.0,
              "id": "c1", "source": "api"}
    monkeypatch.setenv(restart.RESIZED_ENV, json.dumps(record))
    assert restart.resized() == record
    monkeypatch.setattr(resize, "_restarted_at", 103.0)
    monkeypatch.setattr(resize.time, "time", lambda: 104.5)
    ev = resize.done_event(record, step=40, world=2)
    assert (ev["checkpoint_s"], ev["restart_s"], ev["exit_s"], ev["first_step_s"],
            ev["total_s"]) == (0.5, 2.5, 0.5, 1.5, 4.5)
    assert (ev["from"], ev["to"], ev["step"], ev["id"]) == (1, 2, 40, "c1")
    monkeypatch.setenv(restart.RESIZED_ENV, "not json")
    assert restart.resized() is None
