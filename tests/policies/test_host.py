"""PolicySet: when hooks are called, and what a failure or a person's change does to a policy."""

from __future__ import annotations

from typing import Any

import pytest

from hpinteract.policies import Change, Context, FunctionPolicy, Policy, PolicySet
from hpinteract.protocol.errors import InvalidCommand


class Recorder(Policy):
    """Records each hook call (hook, step, epoch); optionally returns a change on each step."""

    def __init__(self, name: str, drives: tuple[str, ...] = (),
                 change: dict[str, Any] | None = None) -> None:
        self.name, self.drives, self.change = name, drives, change
        self.calls: list[tuple[str, int, int]] = []

    def on_start(self, ctx: Context) -> None:
        self.calls.append(("on_start", ctx.step, ctx.epoch))

    def on_step(self, ctx: Context) -> Change | None:
        self.calls.append(("on_step", ctx.step, ctx.epoch))
        return Change(self.change, reason="asked") if self.change else None

    def on_epoch_end(self, ctx: Context) -> None:
        self.calls.append(("on_epoch_end", ctx.step, ctx.epoch))

    def on_eval(self, ctx: Context) -> None:
        self.calls.append(("on_eval", ctx.step, ctx.evals[-1]["val_loss"]))

    def steps(self, hook: str = "on_step") -> list[int]:
        return [s for h, s, _ in self.calls if h == hook]


def feed(ps: PolicySet, steps: range, epoch: int = 0, **fields: Any) -> list[Any]:
    return ps.observe([{"step": s, "epoch": epoch, "loss": 1.0, **fields} for s in steps])


def statuses(ps: PolicySet, name: str) -> list[str]:
    return [n["status"] for n in ps.notices if n["policy"] == name]


def test_a_raising_hook_disables_its_policy_and_the_others_run_on():
    calls: list[int] = []

    def boom(ctx: Context) -> None:
        calls.append(ctx.step)
        raise ZeroDivisionError("no")

    ps, other = PolicySet(), Recorder("other")
    ps.add(FunctionPolicy(boom))
    ps.add(other)
    feed(ps, range(5))
    assert calls == [0]
    assert other.steps() == [0, 1, 2, 3, 4]
    failed = [n for n in ps.notices if n["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["policy"] == "boom" and failed[0]["step"] == 0
    assert "Traceback" in failed[0]["error"] and "ZeroDivisionError: no" in failed[0]["error"]
    assert {d["name"]: d["status"] for d in ps.describe()} == {"boom": "failed",
                                                               "other": "active"}


@pytest.mark.parametrize("bad", [42, {"lr": float("nan")}, {1: 2}])
def test_a_bad_return_value_counts_as_a_failure(bad):
    ps = PolicySet()
    ps.add(FunctionPolicy(lambda ctx: bad, name="bad"))
    assert feed(ps, range(3)) == []
    assert statuses(ps, "bad") == ["added", "failed"]


def test_a_manual_change_suspends_the_policies_driving_it_until_enable():
    ps = PolicySet()
    lr, batch = Recorder("lr_policy", drives=("lr",)), Recorder("batch", drives=("batch_size",))
    ps.add(lr)
    ps.add(batch)
    feed(ps, range(3))
    ps.on_applied({"lr": 0.5}, "user", 3)
    assert ps.hparams["lr"] == 0.5
    suspended = [n for n in ps.notices if n["status"] == "suspended"]
    assert [n["policy"] for n in suspended] == ["lr_policy"]
    assert "lr changed by user at step 3" in suspended[0]["reason"]
    feed(ps, range(3, 6))
    assert lr.steps() == [0, 1, 2] and batch.steps() == [0, 1, 2, 3, 4, 5]
    ps.enable("lr_policy")
    feed(ps, range(6, 8))
    assert lr.steps() == [0, 1, 2, 6, 7]
    assert statuses(ps, "lr_policy")[-1] == "enabled"


@pytest.mark.parametrize("source", ["policy:other", "lr_scaling", "job", "resume", "replay"])
def test_changes_that_are_not_a_persons_do_not_suspend(source):
    ps, lr = PolicySet(), Recorder("lr_policy", drives=("lr",))
    ps.add(lr)
    ps.on_applied({"lr": 0.5}, source, 1)
    feed(ps, range(3))
    assert lr.steps() == [0, 1, 2] and "suspended" not in statuses(ps, "lr_policy")


def test_one_decision_in_flight_until_applied_or_settled():
    ps, p = PolicySet(), Recorder("p", drives=("lr",), change={"lr": 0.2})
    ps.add(p)
    (d,) = feed(ps, range(4))
    assert (d.name, d.source, d.step, d.change.values) == ("p", "policy:p", 0, {"lr": 0.2})
    assert p.steps() == [0]
    ps.on_applied({"lr": 0.2}, "policy:p", 4)  # its own change: no suspension
    assert ps.entries["p"].applied_at == 4 and ps.context(ps.entries["p"]).applied_at == 4
    assert len(feed(ps, range(4, 6))) == 1 and p.steps() == [0, 4]
    ps.settle("p", error="out of range")
    feed(ps, range(6, 7))
    assert p.steps() == [0, 4, 6]
    assert "rejected" in statuses(ps, "p") and "suspended" not in statuses(ps, "p")


def test_duplicate_names_are_rejected():
    ps = PolicySet()
    ps.add(Recorder("same"))
    with pytest.raises(InvalidCommand, match="same"):
        ps.add(Recorder("same"))
    with pytest.raises(InvalidCommand, match="every"):
        ps.add(Recorder("another"), every=0)
    with pytest.raises(InvalidCommand, match="no policy named 'nope'"):
        ps.enable("nope")


def test_on_epoch_end_gets_the_epoch_that_ended():
    ps, p = PolicySet(), Recorder("p")
    ps.add(p)
    feed(ps, range(0, 3), epoch=0)
    feed(ps, range(3, 6), epoch=1)
    feed(ps, range(6, 7), epoch=2)
    ends = [(s, e) for h, s, e in p.calls if h == "on_epoch_end"]
    assert ends == [(3, 0), (6, 1)]
    assert ("on_step", 3, 1) in p.calls  # the step hook sees the new epoch


def test_every_sets_the_step_cadence_and_evals_and_events_are_routed():
    ps, p = PolicySet(), Recorder("p")
    ps.add(p, every=3)
    feed(ps, range(10))
    ps.observe([{"kind": "event", "step": 10}, {"step": 10, "eval": True, "val_loss": 0.7}])
    assert p.steps() == [0, 3, 6, 9]
    assert p.calls[0][0] == "on_start" and p.calls[-1] == ("on_eval", 10, 0.7)
    assert len(ps.history) == 10 and len(ps.evals) == 1


def test_add_returns_the_start_decision_and_disable_stops_the_hooks():
    ps = PolicySet()
    ps.observe_status({"lr": 0.1})

    class Starter(Policy):
        def on_start(self, ctx: Context) -> dict[str, Any]:
            return {"lr": ctx.hparams["lr"] / 10}

    (d,) = ps.add(Starter())
    assert d.name == "starter" and d.hook == "on_start" and d.change.values == {"lr": 0.01}
    p = Recorder("p")
    ps.add(p)
    ps.disable("p")
    feed(ps, range(3))
    assert p.steps() == [] and ps.describe()[1]["status"] == "disabled"


def test_a_policy_sees_the_last_published_value_of_a_sparse_metric():
    # The noise scale is published every 16 steps on several ranks; a policy that runs
    # every 10 steps would otherwise never find it in the newest record.
    from hpinteract.policies import AdaptiveBatchSize

    ps = PolicySet(world_size=2)
    ps.observe_status({"batch_size": 32, "lr": 0.1, "monitor_gns": 1, "lr_scaling": "adascale"})
    ps.add(AdaptiveBatchSize(max_batch=256, patience=2, cooldown=0), every=10)
    seen: list[Any] = []
    ps.add(FunctionPolicy(lambda ctx: seen.append(ctx.metrics.get("gns")), "watch"), every=10)
    decisions = []
    for s in range(100):
        rec = {"step": s, "epoch": 0, "loss": 1.0, "batch_size": 32}
        if s % 16 == 1:
            rec["gns"] = 500.0
        decisions += ps.observe([rec])
    assert seen[0] is None and set(seen[1:]) == {500.0}
    grow = [d for d in decisions if d.change.values.get("batch_size")]
    assert grow and grow[0].change.values["batch_size"] == 64, decisions


def test_a_policy_driving_a_value_the_job_cannot_change_is_refused_when_added():
    ps = PolicySet(world_size=2)
    ps.observe_status({"batch_size": 16}, {"batch_size": {"kind": "int", "default": 16,
                                                          "fixed": "the loader is built once"}})
    with pytest.raises(InvalidCommand, match="changes batch_size, which cannot change in "
                                             "this job: the loader is built once"):
        ps.add(Recorder("grow", drives=("batch_size",)))
    assert ps.entries == {}
    ps.add(Recorder("watch", drives=()))  # one that drives nothing else is welcome
