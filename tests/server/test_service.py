"""The extension's logic without a server: chart data, summaries, ids, bodies, JSON."""

from __future__ import annotations

import json
import math

import pytest

from hpinteract.protocol.errors import (
    CheckpointError,
    HpiTimeout,
    InvalidCommand,
    InvalidHParam,
    InvalidState,
    JobNotFound,
)
from hpinteract.protocol.rundir import RunDir, atomic_write_json
from hpinteract.server import handlers, service


def make_run(tmp_path, steps: int, spike_at: int | None = None) -> RunDir:
    rd = RunDir.create("20260101-000000-aaaaaa", tmp_path)
    with open(rd.metrics_log, "w") as f:
        for s in range(steps):
            loss = 100.0 if s == spike_at else 1.0 / (1 + s)
            f.write(json.dumps({"seq": s + 1, "step": s, "loss": loss, "lr": 0.1,
                                "rank0_step_time": 0.01}) + "\n")
    with open(rd.events_log, "w") as f:
        f.write(json.dumps({"seq": 2, "kind": "change", "status": "applied",
                            "values": {"lr": 0.1}, "applied_at_step": 1}) + "\n")
    atomic_write_json(rd.job_file, {"script": "train.py", "nproc": 2, "created": 1.0})
    atomic_write_json(rd.state_file, {"state": "finished", "step": steps, "epoch": 0,
                                      "latest": {"loss": float("nan"), "progress": 1.0}})
    return rd


def test_the_chart_history_is_decimated_keeping_ends_and_spikes(tmp_path):
    rd = make_run(tmp_path, 20_000, spike_at=12_345)
    h = service.chart_history(rd, points=500)
    loss = h["metrics"]["loss"]
    assert len(loss["x"]) <= 500 and loss["x"][0] == 0 and loss["x"][-1] == 19_999
    assert 12_345 in loss["x"] and max(loss["y"]) == 100.0
    assert set(h["metrics"]) == {"loss", "lr"}  # what the chart draws, not per-rank times
    assert h["seq"] == 20_000 and h["count"] == 20_000
    assert [e["seq"] for e in h["events"]] == [2]


def test_a_short_history_is_sent_whole(tmp_path):
    h = service.chart_history(make_run(tmp_path, 30))
    assert h["metrics"]["loss"]["x"] == list(range(30))


def test_live_records_are_cut_to_the_chart_and_evaluations_are_val_loss():
    assert service.chart_record({"seq": 5, "step": 4, "loss": 0.5, "lr": 0.1, "x": 3}) == \
        {"step": 4, "loss": 0.5, "lr": 0.1}
    assert service.chart_record({"seq": 6, "step": 4, "eval": True, "loss": 0.7}) == \
        {"step": 4, "val_loss": 0.7}
    assert service.chart_record({"seq": 7, "step": 5, "loss": math.nan}) == \
        {"step": 5, "loss": None}
    assert service.chart_record({"seq": 8, "step": 5, "rank1_step_time": 0.1}) is None


def test_a_summary_comes_from_the_run_directory_and_is_valid_json(tmp_path):
    rd = make_run(tmp_path, 10)
    jobs = service.Jobs(tmp_path)
    [s] = jobs.summaries()
    assert s["id"] == rd.job_id and s["state"] == "finished" and s["nproc"] == 2
    assert s["loss"] is None and s["progress"] == 1.0  # NaN is not JSON: null
    json.dumps(s, allow_nan=False)


def test_jobs_are_found_by_whole_id_only(tmp_path):
    rd = make_run(tmp_path, 3)
    jobs = service.Jobs(tmp_path)
    assert jobs.get(rd.job_id).id == rd.job_id
    for bad in ("../etc", "/tmp", ".hidden", ""):
        with pytest.raises(InvalidCommand, match="not a job id"):
            jobs.get(bad)
    with pytest.raises(InvalidCommand, match="whole job id"):
        jobs.get(rd.job_id[:10])
    with pytest.raises(JobNotFound):
        jobs.get("20990101-000000-ffffff")


class RefusingJob:
    def set(self, values, source, reason=None):
        raise AssertionError("must not be called")


@pytest.mark.parametrize("body", [None, [], {"lr": 0.1}, {"values": {}}, {"values": [1]}])
def test_a_malformed_set_body_is_refused_before_reaching_the_job(body):
    with pytest.raises(InvalidHParam, match='"values"'):
        service.set_hparams(RefusingJob(), body)


def test_unknown_commands_are_refused():
    with pytest.raises(InvalidCommand, match="unknown command 'explode'"):
        service.command(RefusingJob(), "explode")


def test_typed_errors_map_to_http_statuses_and_replies_are_strict_json():
    assert handlers.status_of(InvalidHParam("x")) == 400
    assert handlers.status_of(JobNotFound("x")) == 404
    assert handlers.status_of(InvalidState("x")) == 409
    assert handlers.status_of(HpiTimeout("x")) == 504
    assert handlers.status_of(CheckpointError("x")) == 500
    assert json.loads(handlers.dumps({"a": [math.inf, 1.0, {"b": math.nan}]})) == \
        {"a": [None, 1.0, {"b": None}]}
