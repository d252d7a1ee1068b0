"""``hpi.launch(resume=...)``: a 2-rank job continues from its checkpoint in the same run
directory, with the hyper-parameters in force at the checkpoint (never the script's or the
saved optimizer's lr), mid-epoch, and a metrics log that has every step once."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import TOY, trace, wait_for_step

import hpinteract as hpi
from hpinteract.client.history import read_records
from hpinteract.protocol.errors import ConfigError, InvalidState
from hpinteract.trainer.checkpoint import load

N, BATCH = 2048, 16  # 128 steps an epoch


def test_a_resumed_job_continues_where_its_checkpoint_was(tmp_path):
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.004}, args=["--n", str(N)])
    wait_for_step(job, 20)
    with pytest.raises(InvalidState, match="running"):
        hpi.launch(resume=job.id)
    change = job.set(lr=0.02, dropout=0.3)
    ack = job.checkpoint()
    s = ack.applied_at_step
    wait_for_step(job, s + 30)  # these steps are lost on resume, and run again
    job.stop()
    assert job.wait(60).value == "finished"
    first = [trace(job, r) for r in (0, 1)]
    shutil.copy(job.run_dir.metrics_log, tmp_path / "first.jsonl")

    again = hpi.launch(resume=job.id, hparams={"momentum": 0.5})
    assert again.id == job.id and again.run_dir.path == job.run_dir.path
    wait_for_step(again, s + 10)
    assert again.hparams["lr"] == 0.02 and again.hparams["dropout"] == 0.3
    assert again.hparams["momentum"] == 0.5  # this launch's override, on top
    kept = again.checkpoint()  # the resumed run's own
    again.stop()
    assert again.wait(60).value == "finished", again.logs()
    second = [trace(again, r) for r in (0, 1)]
    for r in (0, 1):
        old = {row["step"]: row for row in first[r]}
        row = second[r][0]
        # It starts at the checkpoint's step, with the lr in force then (not the script's
        # 0.05, not the optimizer state's), on the samples the first run used there.
        assert row["step"] == s and row["lr"] == 0.02 and row["dropout"] == 0.3
        assert row["idx"] == old[s]["idx"] and row["epoch"] == old[s]["epoch"]
        assert [t["step"] for t in second[r]] == list(range(s, s + len(second[r])))

    steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    assert steps == list(range(len(steps)))  # each step once, none missing
    before = {m["step"]: m for m in read_records(tmp_path / "first.jsonl")}
    after = {m["step"]: m for m in read_records(job.run_dir.metrics_log)}
    assert after[s - 1]["loss"] == before[s - 1]["loss"]  # kept as it was
    # The same model state and the same data give the same loss at the first step again.
    assert after[s]["loss"] == pytest.approx(before[s]["loss"], rel=1e-6)
    superseded = read_records(job.run_dir.path / "metrics.superseded.jsonl")
    assert superseded and min(m["step"] for m in superseded) == s
    seqs = [m["seq"] for m in read_records(job.run_dir.metrics_log)]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert max(seqs) > max(m["seq"] for m in superseded)  # seq numbers go on, not back

    ev = job.events()
    [resumed] = ev[ev.kind == "resume"].to_dict("records")
    assert resumed["step"] == s and resumed["steps_lost"] >= 30
    states = ev[ev.kind == "state"].state.tolist()
    assert states.count("running") == 2 and states[-1] == "finished"
    # The change history goes on: a checkpoint of the resumed run still holds the first
    # run's change (its id and step).
    spec = json.loads(job.run_dir.job_file.read_text())
    assert spec["resumes"] == 1 and spec["resume"]["checkpoint"].endswith(f"{s:09d}.pt")
    assert kept.applied_at_step > s
    held = [c for c in load(kept.path)["changes"] if c["id"] == change.change_id]
    assert [c["applied_at_step"] for c in held] == [change.applied_at_step]


def test_resume_needs_an_ended_job_with_a_checkpoint():
    job = hpi.launch(TOY, nproc=1, args=["--n", "64", "--epochs", "1"])
    assert job.wait(60).value == "finished"
    with pytest.raises(ConfigError, match="no checkpoint to resume from"):
        hpi.launch(resume=job.id)
    with pytest.raises(ConfigError, match="resume= or job_id="):
        hpi.launch(resume=job.id, job_id="x")
