"""``hpi.compare``: one metric of several jobs in one figure, from their run directories
(finished jobs here; the live path is the dashboard's, tested in test_dashboard.py)."""

from __future__ import annotations

import json

import pytest

import hpinteract as hpi
from hpinteract.protocol.rundir import RunDir, atomic_write_json


def finished_job(home, job_id, scale):
    rd = RunDir.create(job_id, home)
    atomic_write_json(rd.job_file, {"job_id": job_id, "script": "t.py", "nproc": 1})
    atomic_write_json(rd.state_file, {"state": "finished", "step": 300})
    with open(rd.metrics_log, "w") as f:
        for i in range(300):
            f.write(json.dumps({"seq": i + 1, "step": i, "loss": scale / (i + 1),
                                "acc": 0.5}) + "\n")
    return hpi.attach(job_id, home=home)


def test_compare_overlays_one_metric_per_job(tmp_path):
    a, b = finished_job(tmp_path, "job-a", 1.0), finished_job(tmp_path, "job-b", 2.0)
    c = hpi.compare([a, b], metric="loss", labels=["lr 0.1", "lr 0.2"])
    try:
        assert list(c.plots.figures) == ["loss"]  # one figure, both lines
        assert c.point_counts() == {"lr 0.1": 300, "lr 0.2": 300}
        src = c.plots._sources["lr 0.2"].data
        assert src["raw"][0] == 2.0
        for _ in range(50):  # the feeds find nothing newer in the finished runs
            if not c._tick():
                break
        assert c.point_counts() == {"lr 0.1": 300, "lr 0.2": 300}
    finally:
        c.close()


def test_compare_refuses_mismatched_labels(tmp_path):
    a = finished_job(tmp_path, "job-c", 1.0)
    with pytest.raises(ValueError, match="labels must name each job once"):
        hpi.compare([a, a], labels=["x", "x"])
    with pytest.raises(ValueError, match="at least one job"):
        hpi.compare([])
