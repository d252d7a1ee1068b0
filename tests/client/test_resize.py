"""``job.resize(n)`` / ``job.set(workers=n)``: a running job goes 1 -> 2 -> 4 -> 1 ranks and
trains as if it had not been resized: every step once, the same global batch over the
ranks of each size, each epoch's samples once, the launch's and later values kept, and the
same final parameters as a job that never changed size. Bad sizes are refused, nothing
applied."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import pytest
import torch
from helpers import JOBS, wait_for_step

import hpinteract as hpi
from hpinteract.client.history import read_records

JOB = JOBS / "resize_job.py"
N, EPOCHS, BATCH = 1024, 2, 16
STEPS = EPOCHS * N // BATCH  # 128


def steps_of(job: hpi.Job) -> dict[int, list[dict]]:
    """Every rank's record of every step, from each torchrun start's files."""
    out: dict[int, list[dict]] = defaultdict(list)
    for path in (job.run_dir.path / "steps").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "step" in rec:  # not the digest lines of the sync tests
                out[rec["step"]].append(rec)
    return out


def final_params(job: hpi.Job) -> torch.Tensor:
    return torch.tensor(json.loads((job.run_dir.path / "final.json").read_text()))


def test_a_job_resized_1_2_4_1_trains_as_if_it_had_not_been():
    # lr at launch: the restarts of a resize must keep it over the script's 0.05.
    job = hpi.launch(JOB, nproc=1, hparams={"lr": 0.03, "sleep": 0.02},
                     args=["--n", str(N), "--epochs", str(EPOCHS)])
    seen: list[dict] = []
    follower = threading.Thread(target=lambda: seen.extend(job.stream()), daemon=True)
    follower.start()
    wait_for_step(job, 8)
    job.set(sleep=0.015)  # a change before the resizes, which must survive them
    acks = []
    for n in (2, 4, 1):
        acks.append(job.resize(n))
        wait_for_step(job, acks[-1].applied_at_step + 6)
    assert job.hparams["workers"] == 1 and job.hparams["sleep"] == 0.015
    assert job.wait(180).value == "finished", job.logs()[-3000:]
    follower.join(30)
    assert job.spec["nproc"] == 1

    # Each step ran once, by all the ranks of one size: the global batch of 16 split evenly,
    # with the launch's lr, and each epoch's samples were taken once over the resizes.
    steps = steps_of(job)
    assert sorted(steps) == list(range(STEPS))
    worlds = []
    for s in range(STEPS):
        recs = steps[s]
        world = recs[0]["world"]
        assert sorted(r["rank"] for r in recs) == list(range(world)), s
        assert all(r["world"] == world and len(r["idx"]) == BATCH // world for r in recs)
        assert {(r["micro"], r["acc"]) for r in recs} == {(BATCH // world, 1)}  # re-planned
        assert {r["lr"] for r in recs} == {0.03}
        worlds.append(world)
    bounds = [a.applied_at_step for a in acks]
    assert worlds == ([1] * bounds[0] + [2] * (bounds[1] - bounds[0])
                      + [4] * (bounds[2] - bounds[1]) + [1] * (STEPS - bounds[2]))
    per_epoch = N // BATCH
    for e in range(EPOCHS):
        idx = [i for s in range(e * per_epoch, (e + 1) * per_epoch) for r in steps[s]
               for i in r["idx"]]
        assert sorted(idx) == list(range(N))
    logged = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    assert logged == list(range(STEPS))

    # The events tell each resize, its checkpoint, and its latency by phase.
    ev = job.events()
    done = ev[(ev.kind == "resize") & (ev.status == "done")].to_dict("records")
    assert [(d["from"], d["to"], d["step"]) for d in done] == [
        (1, 2, bounds[0]), (2, 4, bounds[1]), (4, 1, bounds[2])]
    for d in done:
        parts = d["checkpoint_s"] + d["restart_s"] + d["first_step_s"]
        assert min(d["checkpoint_s"], d["restart_s"], d["first_step_s"]) >= 0
        assert d["total_s"] == pytest.approx(parts, abs=0.01)
        assert d["id"] in {a.change_id for a in acks}
    restarted = ev[(ev.kind == "resize") & (ev.status == "restarted")]
    assert restarted.steps_lost.tolist() == [0, 0, 0]
    changes = ev[ev.kind == "change"]
    assert [v.get("workers") for v in changes["values"] if "workers" in v] == [2, 4, 1]

    # A subscriber followed the job through its three restarts: every record once, in order.
    seqs = [r["seq"] for r in seen]
    assert seqs == sorted(set(seqs))
    assert {r["step"] for r in seen if "kind" not in r} == set(range(STEPS))

    # The same training as a job that kept 2 ranks all along (float sums in another order).
    plain = hpi.launch(JOB, nproc=2, hparams={"lr": 0.03},
                       args=["--n", str(N), "--epochs", str(EPOCHS)])
    assert plain.wait(120).value == "finished", plain.logs()[-3000:]
    torch.testing.assert_close(final_params(job), final_params(plain), rtol=1e-4, atol=1e-5)


def test_a_rank_that_dies_by_a_signal_after_leaving_for_a_resize_does_not_fail_the_job():
    """torch + gloo sometimes abort a rank at teardown, after it left: the resize checkpoint
    is on disk by then, so the job goes on with the new size, and an event says so."""
    n = 1024  # 64 steps of 20 ms at least: the resize comes well before the end
    job = hpi.launch(JOB, nproc=2, hparams={"sleep": 0.02},
                     args=["--n", str(n), "--epochs", "1", "--abort-leaving", "1"])
    wait_for_step(job, 5)
    ack = job.resize(1)
    assert job.wait(120).value == "finished", job.logs()[-3000:]
    steps = steps_of(job)
    assert sorted(steps) == list(range(n // BATCH))
    assert {r["world"] for s in range(ack.applied_at_step, n // BATCH) for r in steps[s]} == {1}
    ev = job.events()
    [warning] = ev[ev.kind == "warning"].to_dict("records")
    assert warning["source"] == "supervisor" and warning["error"]["rank"] == 1
    assert warning["error"]["exitcode"] == -6 and "after leaving for a resize" in warning["message"]
    done = ev[(ev.kind == "resize") & (ev.status == "done")].to_dict("records")
    assert [(d["from"], d["to"], d["step"]) for d in done] == [(2, 1, ack.applied_at_step)]
    assert ev[ev.kind == "state"].state.tolist()[-1] == "finished"


def test_sizes_the_job_cannot_take_are_refused_and_nothing_applies():
    job = hpi.launch(JOB, nproc=2, hparams={"sleep": 0.01},
                     args=["--n", str(N), "--epochs", "1000"])
    try:
        wait_for_step(job, 3)
        with pytest.raises(hpi.InvalidHParam, match="workers=0 is below the minimum") as e:
            job.resize(0)
        assert e.value.field == "workers"
        with pytest.raises(hpi.InvalidHParam, match="batch_size=16 cannot be shared by 3 "
                                                    "ranks") as e:
            job.set(workers=3)
        assert e.value.field == "workers"
        with pytest.raises(hpi.InvalidHParam, match="workers"):
            job.set(workers="four")
        with pytest.raises(hpi.InvalidHParam, match="batch_size=18 cannot be shared by 4"):
            job.set(batch_size=18, workers=4)  # each alone would do: the pair is refused
        job.pause()
        with pytest.raises(hpi.InvalidHParam, match="it is paused: resume it first"):
            job.resize(1)
        job.resume()
        ev = job.events()
        rejected = ev[(ev.kind == "change") & (ev.status == "rejected")]
        assert len(rejected) == 5
        assert not (ev.kind == "resize").any()
        assert job.status()["world_size"] == 2
        assert job.hparams["workers"] == 2 and job.hparams["batch_size"] == 16
    finally:
        job.stop()
        job.wait(60)


def test_a_policy_can_resize_the_job():
    """A notebook's policy asks for a second rank once training is under way (the shape of
    KungFu's resource policy): its change resizes the job like any other source's."""
    job = hpi.launch(JOB, nproc=1, hparams={"sleep": 0.02},
                     args=["--n", str(N), "--epochs", "1000"])
    try:
        def grow(ctx):
            if ctx.hparams.get("workers") == 1 and ctx.step >= 10:
                return {"workers": 2}
            return None

        name = job.add_policy(grow, every=1, name="grow")
        wait_for_step(job, 10)
        deadline = time.monotonic() + 90
        while not (job.status().get("world_size") == 2 and job.state == hpi.JobState.RUNNING):
            assert time.monotonic() < deadline, job.events().tail(10).to_string()
            time.sleep(0.2)
        ev = job.events()
        [change] = ev[(ev.kind == "change") & ev["values"].map(
            lambda v: isinstance(v, dict) and "workers" in v)].to_dict("records")
        assert change["source"] == f"policy:{name}" and change["status"] == "applied"
        wait_for_step(job, int(change["applied_at_step"]) + 5)
        [p] = [p for p in job.policies() if p["name"] == name]
        assert p["status"] == "active" and not p.get("error"), p
    finally:
        job.remove_policy("grow")
        job.stop()
        job.wait(60)


def test_the_scale_workers_policy_tries_a_second_rank_and_comes_back():
    """KungFu's resource policy, in the job: a second rank does not give this sleep-bound
    job 1.5x the samples a second, so it goes back to one and rests. Added by name from
    here, the policy is made again after each restart (its state is in the checkpoints)."""
    job = hpi.launch(JOB, nproc=1, hparams={"sleep": 0.02},
                     args=["--n", str(N), "--epochs", "1000"])

    def resizes() -> list[dict]:
        ev = job.events()
        if "status" not in ev:
            return []
        return ev[(ev.kind == "resize") & (ev.status == "done")].to_dict("records")

    try:
        wait_for_step(job, 2)
        job.add_policy("scale_workers", max_workers=2, min_gain=0.5, window=15, settle=5)
        deadline = time.monotonic() + 150
        while len(resizes()) < 2:
            assert time.monotonic() < deadline, job.events().tail(12).to_string()
            time.sleep(0.5)
        assert [(d["from"], d["to"]) for d in resizes()] == [(1, 2), (2, 1)]
        ev = job.events()
        reasons = ev[(ev.kind == "change") & (ev.source == "policy:scale_workers")].reason
        assert "trying 2" in reasons.iloc[0] and "back to 1" in reasons.iloc[1]
        [p] = [p for p in job.policies() if p["name"] == "scale_workers"]
        assert p["status"] == "active" and p["where"] == "job"
        wait_for_step(job, int(job.status()["latest"]["step"]) + 40)
        assert len(resizes()) == 2  # resting: no flapping
    finally:
        job.stop()
        job.wait(60)
