"""Policies against real 2-rank jobs: a notebook's own (client-side) and the job's built-ins
by name, their decisions on every rank at one step, precedence, failure, rollback."""

import pytest
from helpers import JOBS, trace, until, wait_for_step

import hpinteract as hpi
from hpinteract.policies import Policy

POLICY_JOB = JOBS / "policy_job.py"


def events(job, **match):
    """The job's events with these field values, or None if there are none."""
    ev = job.events()
    for k, v in match.items():
        if k not in ev:
            return None
        ev = ev[ev[k] == v]
    return ev if len(ev) else None


@pytest.fixture
def job(tmp_path):
    j = hpi.launch(POLICY_JOB, nproc=2, cwd=tmp_path)
    wait_for_step(j, 3)
    yield j
    if not j.state.terminal:
        j.stop()
    j.wait(60)


class HalveOnce(Policy):
    name = "halve"
    drives = ("lr",)

    def __init__(self):
        self.done = False

    def on_step(self, ctx):
        if not self.done and ctx.step >= 10:
            self.done = True
            return {"lr": ctx.hparams["lr"] / 2}
        return None


def test_a_client_policy_change_lands_on_every_rank_at_one_step(job):
    assert job.add_policy(HalveOnce(), every=2) == "halve"
    change = until(lambda: events(job, kind="change", source="policy:halve"),
                   what="the policy's change")
    step = int(change.iloc[0]["applied_at_step"])
    assert job.hparams["lr"] == pytest.approx(0.005)
    job.stop()
    job.wait(60)
    for rank in (0, 1):
        lrs = {t["step"]: t["lr"] for t in trace(job, rank)}
        assert lrs[step - 1] == pytest.approx(0.01) and lrs[step] == pytest.approx(0.005)
    assert [p["name"] for p in job.policies()] == ["halve"]


def test_a_raising_policy_is_disabled_and_reported_while_the_job_trains_on(job):
    def broken(ctx):
        raise ZeroDivisionError("policy bug")

    job.add_policy(broken, every=1)
    failed = until(lambda: [p for p in job.policies() if p["status"] == "failed"],
                   what="the failure")
    assert failed[0]["name"] == "broken" and "ZeroDivisionError" in failed[0]["error"]
    note = until(lambda: events(job, kind="policy", status="failed"),
                 what="the failure in the job's events")
    assert note.iloc[0]["policy"] == "broken"
    step = job.status()["step"]
    wait_for_step(job, step + 5)  # training went on
    assert job.state.value == "running"


def test_a_manual_change_suspends_a_builtin_driving_it_until_enabled(job):
    job.add_policy("schedule", kind="cosine", total_steps=100_000, every=1)
    job.set(lr=0.02)  # a person's decision wins
    listed = until(lambda: [p for p in job.policies() if p["status"] == "suspended"],
                   what="the suspension")
    assert listed[0]["where"] == "job" and "lr changed by api" in listed[0]["reason"]
    assert len(events(job, kind="policy", status="suspended", policy="schedule")) == 1
    job.enable_policy("schedule")
    assert [p["status"] for p in job.policies()] == ["active"]


def test_builtins_by_name_reject_bad_parameters_clearly(job):
    with pytest.raises(hpi.InvalidCommand, match="max_batch"):
        job.add_policy("adaptive_batch", max_batch="big")
    known = r"unknown policy 'no_such_policy' \(known: adaptive_batch,"
    with pytest.raises(hpi.InvalidCommand, match=known):
        job.add_policy("no_such_policy")
    assert job.policies() == []


def test_the_divergence_guard_rolls_back_and_lowers_lr(job):
    # max_rollbacks high: on a loaded machine the first restored state can still be on its
    # way up, and a second rollback follows; the test waits for them to settle.
    job.add_policy("divergence_guard", lr_factor=0.01, snapshot_every=5, every=1,
                   max_rollbacks=10)
    guard = until(lambda: events(job, kind="guard"), what="the guard's first snapshot")
    assert guard.iloc[0]["snapshot_every"] == 5 and guard.iloc[0]["source"] == \
        "policy:divergence_guard"
    wait_for_step(job, int(guard.iloc[0]["step"]) + 20)  # a baseline of good losses
    job.set(lr=5.0)  # far too high for this regression: the loss explodes
    rollback = until(lambda: events(job, kind="rollback"), what="a rollback")
    assert rollback.iloc[0]["status"] == "restored"
    assert rollback.iloc[0]["restored_step"] <= rollback.iloc[0]["step"]
    while True:  # until 15 steps pass without another rollback (the guard acts every step)
        rollbacks = events(job, kind="rollback")
        wait_for_step(job, int(job.status()["latest"]["step"]) + 15)
        if len(events(job, kind="rollback")) == len(rollbacks):
            break
    assert job.hparams["lr"] == pytest.approx(5.0 * 0.01 ** len(rollbacks))
    after = int(rollbacks.iloc[-1]["step"])
    wait_for_step(job, after + 30)
    losses = job.metrics().set_index("step")["loss"]
    assert losses.loc[after + 10:].max() < 100  # back to sane values
    assert job.state.value == "running"


def test_adaptive_batch_from_init_grows_the_batch_with_lr_scaling(tmp_path):
    j = hpi.launch(POLICY_JOB, nproc=2, args=["--adaptive", "--epochs", "3"], cwd=tmp_path)
    assert j.wait(180).value == "finished", j.error
    ev = j.events()
    mine = ev[(ev["kind"] == "change") & (ev["source"] == "policy:adaptive_batch")]
    assert mine.iloc[0]["values"] == {"monitor_gns": 1, "lr_scaling": "linear"}  # on_start
    grow = mine.iloc[1:]
    scale = ev[(ev["kind"] == "change") & (ev["source"] == "lr_scaling")]
    assert [v["batch_size"] for v in grow["values"]] == [32, 64]
    assert list(scale["applied_at_step"]) == list(grow["applied_at_step"])
    assert [v["lr"] for v in scale["values"]] == pytest.approx([0.02, 0.04])
    assert all("batch_size 16 -> 32" in r or "batch_size 32 -> 64" in r for r in scale["reason"])
    for rank in (0, 1):
        t = trace(j, rank)
        assert {s["local_batch"] for s in t} >= {8, 16, 32}
    m = j.metrics()
    assert m["gns"].notna().any()
    # The per-rank times monitor (every 100 steps by default) shows both ranks.
    both = m.dropna(subset=["step_time_r0", "step_time_r1"])
    assert len(both) >= 1 and (both["step_time_r1"] > 0).all() and (both["straggler"] >= 1).all()


def test_goodput_by_name_grows_the_batch_with_its_reason_and_reports_in_the_metrics(job):
    """A step here is mostly fixed cost (the job sleeps 2 ms a step): a larger batch is
    nearly free, so the predicted goodput grows with it while the noise scale allows."""
    job.add_policy("goodput", max_batch=256, interval=30)
    def decided() -> bool:
        ev = events(job, kind="change", source="policy:goodput")
        return ev is not None and any("batch_size" in v for v in ev["values"])

    until(decided, timeout=120, what="a batch decision")
    grew = events(job, kind="change", source="policy:goodput")
    assert grew.iloc[0]["values"] == {"monitor_gns": 1, "lr_scaling": "adascale"}  # on_start
    first = next(r for _, r in grew.iterrows() if "batch_size" in r["values"])
    assert 16 < first["values"]["batch_size"] <= 256
    assert first["reason"].startswith("goodput ") and "predicted" in first["reason"]
    scaled = events(job, kind="change", source="lr_scaling")
    assert first["applied_at_step"] in set(scaled["applied_at_step"])  # adascale moved lr
    until(lambda: "goodput_efficiency" in job.metrics().columns, what="the report")
    m = job.metrics().dropna(subset=["goodput"])
    assert ((m["goodput_efficiency"] > 0) & (m["goodput_efficiency"] <= 1)).all()
    report = next(p for p in job.policies() if p["name"] == "goodput")["report"]
    assert report["goodput"] > 0 and report["goodput_sample_s"] >= 0
