"""``hpi.launch(replay=job)`` runs a job again with its recorded changes at the same steps
(the same loss at every step, with fixed seeds on CPU), and ``job.fork(step, hparams)``
starts a new job from the checkpoint at or before that step with other values."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import TOY, trace, wait_for_step

import hpinteract as hpi
from hpinteract.client.history import read_records
from hpinteract.protocol.errors import ConfigError
from hpinteract.trainer.checkpoint import load

ARGS = ["--n", "2048", "--epochs", "1", "--seed", "0"]  # 128 steps of 16 samples


def _steps(job: hpi.Job) -> dict[int, dict]:
    return {m["step"]: m for m in read_records(job.run_dir.metrics_log) if not m.get("eval")}


@pytest.fixture(scope="module")
def original():
    """A 2-rank job changed three times (one change derives an lr by linear scaling),
    checkpointed once, and stopped."""
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.004}, args=ARGS)
    try:
        wait_for_step(job, 8)
        job.set(lr=0.02, mode="b")
        wait_for_step(job, 20)
        ack = job.checkpoint()
        wait_for_step(job, ack.applied_at_step + 5)
        job.set(batch_size=32, lr_scaling="linear")  # lr 0.02 -> 0.04, its own change
        wait_for_step(job, ack.applied_at_step + 15)
        job.stop()
        assert job.wait(60).value == "finished", job.logs()
    finally:
        if not job.state.terminal:
            job.stop()
    return job, ack.applied_at_step


def test_a_replay_has_the_same_changes_at_the_same_steps_and_the_same_losses(original):
    job, _ = original
    again = hpi.launch(replay=job.id)
    assert again.id != job.id
    assert again.wait(120).value == "finished", again.logs()
    first, second = _steps(job), _steps(again)
    assert sorted(second) == sorted(first)  # stopped at the same step
    for s in first:  # exactly: same seeds, same data, same values at the same steps
        assert second[s]["loss"] == first[s]["loss"], s
        assert (second[s]["lr"], second[s]["batch_size"]) == (first[s]["lr"],
                                                               first[s]["batch_size"])
    for r in (0, 1):
        assert trace(again, r) == trace(job, r)  # samples, lr, mode at every step

    def changes(j):
        ev = j.events()
        ch = ev[ev.kind == "change"]
        return [(c["applied_at_step"], c["values"], c["source"]) for c in
                ch.to_dict("records")]

    assert [(s, v) for s, v, _ in changes(again)] == [(s, v) for s, v, _ in changes(job)]
    assert {src for *_, src in changes(again)} == {"replay:api", "replay:lr_scaling"}
    ev = again.events()
    [rep] = ev[ev.kind == "replay"].to_dict("records")
    assert rep["of"] == job.id and rep["changes"] == 4  # 3 changes and the stop


def test_a_fork_starts_from_the_checkpoint_with_other_values(original):
    job, s = original
    with pytest.raises(ConfigError, match=f"no checkpoint at or before step 3.*{s}"):
        job.fork(3)
    child = job.fork(s + 4, hparams={"lr": 0.005, "checkpoint_every": 40})
    assert child.parent == {"job_id": job.id, "step": s, "asked": s + 4}
    assert child.wait(120).value == "finished", child.logs()  # to the end of its epoch
    parent_steps, steps = _steps(job), _steps(child)
    assert min(steps) == s and sorted(steps) == list(range(s, 128))
    # The same state and the same samples: the same loss at its first step; then lr 0.005
    # (instead of the 0.02 in force at the checkpoint) makes it another run.
    assert steps[s]["loss"] == pytest.approx(parent_steps[s]["loss"], rel=1e-6)
    assert steps[s]["lr"] == 0.005 and steps[s + 1]["loss"] != parent_steps[s + 1]["loss"]
    assert child.hparams["mode"] == "b"  # the value in force at the checkpoint
    for r in (0, 1):
        assert trace(child, r)[0]["idx"] == next(t for t in trace(job, r)
                                                 if t["step"] == s)["idx"]
    ev = child.events()
    [forked] = ev[ev.kind == "fork"].to_dict("records")
    assert forked["parent"] == job.id and forked["step"] == s
    # The change history goes with it: the fork's own checkpoints hold the parent's
    # changes from before the fork point.
    parent_change = job.events().query("kind == 'change'").iloc[0]["id"]
    saved = load(Path(child.checkpoints()[-1]["path"]))
    assert parent_change in {c["id"] for c in saved["changes"]}
