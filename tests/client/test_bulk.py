"""Opening a job's history from its run directory: columns, non-finite values, a torn last
line, and the seam with the live stream."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hpinteract.client import bulk
from hpinteract.client.history import read_records
from hpinteract.protocol.rundir import RunDir


def write_log(rd: RunDir, n: int, torn: bool = False) -> None:
    with open(rd.metrics_log, "w") as f:
        for i in range(n):
            loss = float("nan") if i == 7 else float("inf") if i == 8 else 1.0 / (i + 1)
            rec = {"seq": i + 1, "step": i, "epoch": 0, "loss": loss, "note": "NaN-ish"}
            if i % 10 == 0:
                rec["gns"] = float(i)
            f.write(json.dumps(rec) + "\n")  # as the job writes it: NaN, Infinity
        if torn:
            f.write('{"seq": 99999, "step": 99')
    with open(rd.events_log, "w") as f:
        for seq in (3, n + 5):  # one inside the history, one after it
            f.write(json.dumps({"seq": seq, "kind": "change", "status": "applied",
                                "values": {"lr": 0.1}, "applied_at_step": seq}) + "\n")


@pytest.fixture(params=["arrow", "json"])
def reader(request, monkeypatch):
    if request.param == "json":
        monkeypatch.setattr(bulk, "_arrow_columns", lambda data: None)
    return request.param


def test_history_as_columns_with_gaps_for_non_finite_values(tmp_path, reader):
    rd = RunDir.create("j1", tmp_path)
    write_log(rd, 50, torn=True)
    h = bulk.load_history(rd)
    assert h.count == 50 and h.last_seq == 50  # the torn line is the live stream's
    steps, loss = h.columns["loss"]
    assert steps.tolist() == list(range(50))
    assert math.isnan(loss[7]) and math.isnan(loss[8])  # a gap, not a dropped point
    assert loss[9] == pytest.approx(0.1)
    gsteps, gns = h.columns["gns"]
    assert gsteps.tolist() == [0, 10, 20, 30, 40] and gns.tolist() == [0, 10, 20, 30, 40]
    assert "note" not in h.columns
    assert [e["seq"] for e in h.events] == [3]  # the later one comes with the stream
    assert h.last_metric is not None and h.last_metric["step"] == 49


def test_an_empty_run_directory_opens_empty(tmp_path, reader):
    h = bulk.load_history(RunDir.create("j2", tmp_path))
    assert h.columns == {} and h.count == 0 and h.last_seq == 0


def test_reading_after_a_seq_bisects_to_the_same_records(tmp_path, monkeypatch):
    rd = RunDir.create("j3", tmp_path)
    write_log(rd, 3000)
    from hpinteract.client import history

    for since in (0, 1, 1234, 2999, 3000, 5000):
        monkeypatch.setattr(history, "BISECT_FROM", 1 << 40)
        linear = read_records(rd.metrics_log, since)
        monkeypatch.setattr(history, "BISECT_FROM", 0)
        assert read_records(rd.metrics_log, since) == linear
        assert [r["seq"] for r in linear] == list(range(since + 1, 3001))


def test_both_readers_agree(tmp_path, monkeypatch):
    rd = RunDir.create("j4", tmp_path)
    write_log(rd, 200)
    assert bulk._arrow_columns(rd.metrics_log.read_bytes()) is not None  # not a fallback
    a = bulk.load_history(rd)
    monkeypatch.setattr(bulk, "_arrow_columns", lambda data: None)
    b = bulk.load_history(rd)
    assert a.columns.keys() == b.columns.keys()
    for k in a.columns:
        np.testing.assert_array_equal(a.columns[k][0], b.columns[k][0])
        np.testing.assert_array_equal(a.columns[k][1], b.columns[k][1])


def test_the_columnar_copy_is_preferred_and_agrees_with_the_log(tmp_path, monkeypatch):
    from hpinteract.protocol.columns import ColumnWriter

    rd = RunDir.create("j5", tmp_path)
    write_log(rd, 300)
    w = ColumnWriter(rd.columns_dir)
    for rec in read_records(rd.metrics_log):
        w.add(rec)
    w.close()
    fast = bulk.load_history(rd)
    monkeypatch.setattr(bulk, "read_columns", lambda d: None)
    slow = bulk.load_history(rd)
    assert (fast.count, fast.last_seq) == (slow.count, slow.last_seq) == (300, 300)
    assert fast.columns.keys() == slow.columns.keys()
    for k in fast.columns:
        np.testing.assert_array_equal(fast.columns[k][0], slow.columns[k][0])
        np.testing.assert_array_equal(fast.columns[k][1], slow.columns[k][1])
    assert [e["seq"] for e in fast.events] == [3] and fast.last_metric == slow.last_metric
