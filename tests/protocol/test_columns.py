"""The metrics' columnar copy: what the coordinator appends, a reader gets back, up to the
watermark; hostile names stay inside the directory; damage means None (read the log)."""

from __future__ import annotations

import math

import numpy as np

from hpinteract.protocol.columns import ColumnWriter, read_columns


def test_records_round_trip_up_to_the_watermark(tmp_path):
    w = ColumnWriter(tmp_path / "columns")
    for i in range(100):
        rec = {"seq": i + 1, "step": i, "loss": 1.0 / (i + 1), "eval": False, "note": "x"}
        if i % 10 == 0:
            rec["gns"] = float(i)
        if i == 50:
            rec["loss"] = math.nan
        w.add(rec)
    w.flush()
    w.add({"seq": 101, "step": 100, "loss": 0.5})
    with open(tmp_path / "columns" / "loss.f64", "ab") as f:  # a flush half-done
        w._buf["loss"].tofile(f)
    cols, seq, records = read_columns(tmp_path / "columns")
    assert (seq, records) == (100, 100)
    steps, loss = cols["loss"]
    assert steps.tolist() == list(range(100))  # the half-flushed point is not shown
    assert math.isnan(loss[50]) and loss[99] == 0.01
    assert cols["gns"][0].tolist() == list(range(0, 100, 10))
    assert set(cols) == {"loss", "gns"}  # booleans and strings are not columns


def test_a_new_writer_continues_the_count(tmp_path):
    w = ColumnWriter(tmp_path / "c")
    w.add({"seq": 1, "step": 0, "loss": 1.0})
    w.close()
    w = ColumnWriter(tmp_path / "c")
    w.add({"seq": 5, "step": 1, "loss": 2.0})
    w.close()
    cols, seq, records = read_columns(tmp_path / "c")
    assert (seq, records) == (5, 2) and cols["loss"][1].tolist() == [1.0, 2.0]


def test_metric_names_cannot_leave_the_directory(tmp_path):
    w = ColumnWriter(tmp_path / "c")
    w.add({"seq": 1, "step": 0, "../../evil": 1.0, "a/b": 2.0, ".seq.tmp": 3.0})
    w.close()
    assert not (tmp_path / "evil.f64").exists()
    assert {p.parent for p in (tmp_path / "c").iterdir()} == {tmp_path / "c"}
    cols, _, _ = read_columns(tmp_path / "c")
    assert {k: v[1].tolist() for k, v in cols.items()} == {
        "../../evil": [1.0], "a/b": [2.0], ".seq.tmp": [3.0]}


def test_missing_or_damaged_columns_read_as_none(tmp_path):
    assert read_columns(tmp_path / "nothing") is None
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "seq").write_text("garbage")
    assert read_columns(tmp_path / "c") is None


def test_the_files_are_owner_only(tmp_path):
    w = ColumnWriter(tmp_path / "c")
    w.add({"seq": 1, "step": 0, "loss": 1.0})
    w.close()
    assert (tmp_path / "c").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "c" / "loss.f64").stat().st_mode & 0o777 == 0o600
    np.testing.assert_array_equal(np.fromfile(tmp_path / "c" / "loss.f64"), [1.0, 0.0, 1.0])
