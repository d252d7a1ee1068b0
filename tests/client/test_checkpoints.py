"""``job.checkpoint()`` and ``checkpoint_every`` against a real 2-rank torchrun job on gloo."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import TOY, wait_for_step

import hpinteract as hpi
from hpinteract.protocol.errors import InvalidHParam, InvalidState
from hpinteract.trainer.checkpoint import load

N, BATCH = 2048, 16  # 128 steps an epoch


@pytest.fixture(scope="module")
def job():
    j = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.004}, args=["--n", str(N)])
    wait_for_step(j, 5)
    yield j
    if not j.state.terminal:
        j.stop()
    j.wait(60)


def test_a_checkpoint_holds_the_state_of_the_acknowledged_step(job):
    change = job.set(lr=0.03, dropout=0.4, reason="before saving")
    ack = job.checkpoint()
    assert ack.state == "checkpoint" and ack.applied_at_step >= change.applied_at_step
    state = load(ack.path)
    step = ack.applied_at_step
    assert state["step"] == step and state["job_id"] == job.id
    assert state["hparams"]["lr"] == 0.03 and state["hparams"]["dropout"] == 0.4
    assert state["last_changed"]["lr"] == change.applied_at_step
    # The optimizer in the file already holds the new lr, and the loader's position is the
    # samples the steps so far took from this epoch.
    assert state["optimizer"]["param_groups"][0]["lr"] == 0.03
    assert state["loader"]["position"] == (step % (N // BATCH)) * BATCH
    assert set(state["model"]) == {"weight", "bias"}  # DDP's "module." prefix is gone
    assert isinstance(state["rng"]["torch"], torch.Tensor)
    applied = [c for c in state["changes"] if c["id"] == change.change_id]
    assert applied and applied[0]["applied_at_step"] == change.applied_at_step
    assert applied[0]["reason"] == "before saving"
    events = job.events()
    row = events[(events.kind == "checkpoint") & (events.id == ack.change_id)].iloc[0]
    assert row.status == "written" and row.step == step and row.bytes > 0
    assert [c["step"] for c in job.checkpoints()] == [step]


def test_a_paused_job_checkpoints_without_moving(job):
    job.pause()
    try:
        a = job.checkpoint()
        b = job.checkpoint()
        assert a.applied_at_step == b.applied_at_step
        assert job.status()["state"] == "paused"
    finally:
        job.resume()


def test_periodic_checkpoints_follow_the_hyper_parameter_and_keep_the_newest_two(job):
    with pytest.raises(InvalidHParam, match="checkpoint_every"):
        job.set(checkpoint_every=-5)
    ack = job.set(checkpoint_every=10)
    wait_for_step(job, ack.applied_at_step + 45)
    job.set(checkpoint_every=0)
    periodic = [c for c in job.checkpoints() if c["periodic"]]
    assert len(periodic) == 2
    assert all(c["step"] > ack.applied_at_step for c in periodic)
    assert periodic[1]["step"] - periodic[0]["step"] >= 10
    events = job.events()
    written = events[(events.kind == "checkpoint") & (events.source == "job:checkpoint_every")]
    # At least 45 steps at one a >= 10 steps: three or more written (how many depends on
    # where the control sync points fell); the newest two are the ones kept, and every
    # older one was pruned from disk.
    assert len(written) >= 3
    assert list(written.step)[-2:] == [c["step"] for c in periodic]
    assert not any(Path(f).exists() for f in list(written.file)[:-2])
    assert all(Path(f).exists() for f in list(written.file)[-2:])
    # The two taken while paused are one file (same step); asked-for ones are never pruned.
    assert len([c for c in job.checkpoints() if not c["periodic"]]) == 2


def test_a_finished_job_cannot_checkpoint(job):
    job.stop()
    job.wait(60)
    with pytest.raises(InvalidState, match="finished"):
        job.checkpoint()
    # What was written survives the job's end.
    kept = job.checkpoints()
    assert kept and all(load(c["path"])["format"] == 1 for c in kept)
