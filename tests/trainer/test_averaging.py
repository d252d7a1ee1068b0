"""``sync``: a running 2-rank job switches from synchronous SGD to model averaging and back.
In ssgd the ranks hold one model after every step; with model averaging they drift apart
with their local steps and are one model again after every ``averaging_period``-th step;
back in ssgd they agree from the switch on (parameters and momentum averaged)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from helpers import JOBS, wait_for_step

import hpinteract as hpi
from hpinteract.trainer.averaging import sync_check

JOB = JOBS / "resize_job.py"


def digests(job: hpi.Job) -> dict[int, dict[int, dict]]:
    """{step: {rank: the record written after that step}}."""
    out: dict[int, dict[int, dict]] = defaultdict(dict)
    for path in (job.run_dir.path / "steps").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "after" in rec:
                out[rec["after"]][rec["rank"]] = rec
    return out


def test_sync_switches_to_model_averaging_and_back_during_training():
    job = hpi.launch(JOB, nproc=2, hparams={"sleep": 0.01},
                     args=["--n", "1024", "--epochs", "2"])
    wait_for_step(job, 10)
    to_ma = job.set(sync="model_averaging", averaging_period=5)
    wait_for_step(job, to_ma.applied_at_step + 25)
    back = job.set(sync="ssgd")
    assert job.wait(120).value == "finished", job.logs()[-3000:]

    d = digests(job)
    assert sorted(d) == list(range(128)) and all(len(r) == 2 for r in d.values())
    same = {s: d[s][0]["digest"] == d[s][1]["digest"] for s in d}
    mode = {s: d[s][0]["sync"] for s in d}
    a, b = to_ma.applied_at_step, back.applied_at_step
    assert {mode[s] for s in range(a)} == {"ssgd"} and {mode[s] for s in range(b, 128)} \
        == {"ssgd"} and {mode[s] for s in range(a, b)} == {"model_averaging"}
    assert all(same[s] for s in range(a)), "ssgd: one model on both ranks"
    local = [s for s in range(a, b - 1) if (s + 1) % 5]
    averaged = [s for s in range(a, b - 1) if (s + 1) % 5 == 0]
    assert averaged and not any(same[s] for s in local), "local steps drift apart"
    assert all(same[s] for s in averaged), "one model after each average"
    assert all(same[s] for s in range(b - 1, 128)), "ssgd again from the switch on"

    ev = job.events()
    applied = ev[(ev.kind == "change") & (ev.status == "applied")]["values"].tolist()
    assert {"sync": "model_averaging", "averaging_period": 5} in applied
    assert {"sync": "ssgd"} in applied


def test_bad_sync_values_are_refused():
    job = hpi.launch(JOB, nproc=2, hparams={"sleep": 0.01},
                     args=["--n", "1024", "--epochs", "1000"])
    try:
        wait_for_step(job, 2)
        with pytest.raises(hpi.InvalidHParam, match="not one of the allowed values") as e:
            job.set(sync="gossip")
        assert e.value.field == "sync"
        with pytest.raises(hpi.InvalidHParam, match="averaging_period=0 is below"):
            job.set(averaging_period=0)
        assert job.hparams["sync"] == "ssgd" and job.hparams["averaging_period"] == 4
    finally:
        job.stop()
        job.wait(60)


def test_model_averaging_needs_a_ddp_model():
    check = sync_check(lambda: "the model given to run.watch is not a "
                               "DistributedDataParallel")
    check({"sync": "ssgd"}, {})  # going (or staying) synchronous is always possible
    with pytest.raises(hpi.InvalidHParam, match="cannot use model averaging: the model") as e:
        check({"sync": "model_averaging"}, {})
    assert e.value.field == "sync"
