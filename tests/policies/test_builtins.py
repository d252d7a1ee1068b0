"""The built-in policies' decisions on scripted metric streams, fed through a PolicySet the way
a job's host does (one decision of a policy in flight, applied at a later step boundary)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
from policy_sim import Sim

from hpinteract.policies import (
    REGISTRY,
    AdaptiveBatchSize,
    Change,
    Context,
    DivergenceGuard,
    EarlyStopping,
    Policy,
    PolicySet,
    ReduceOnPlateau,
    Schedule,
    Warmup,
    create,
)
from hpinteract.protocol.errors import InvalidCommand

NAN = float("nan")


# ---- adaptive batch size ------------------------------------------------------------------------

def test_adaptive_batch_start_turns_the_monitor_on_and_sets_lr_scaling():
    sim = Sim(AdaptiveBatchSize(max_batch=1024, lr_scaling="sqrt", monitor_every=5),
              hparams={"monitor_gns": 0, "lr_scaling": "none"})
    sim.train(1)
    (_, name, change), = sim.applied
    assert name == "adaptive_batch"
    assert change.values == {"monitor_gns": 5, "lr_scaling": "sqrt"}
    assert "noise scale" in change.reason
    # Nothing to ask for when both are already as wanted.
    ps = PolicySet()
    ps.observe_status({"monitor_gns": 10, "lr_scaling": "sqrt", "batch_size": 32})
    assert ps.add(AdaptiveBatchSize(max_batch=1024, lr_scaling="sqrt")) == []
    # By default it moves the lr with the batch by AdaScale (held fixed, a batch grown 32x
    # made little progress a sample: 3.7x slower to the target than the best static one).
    sim = Sim(AdaptiveBatchSize(max_batch=1024), hparams={"lr_scaling": "none"})
    sim.train(1)
    assert sim.hp["lr_scaling"] == "adascale"


# A job already on the policy's default lr scaling: no start-up change to count around.
ADASCALE = {"lr_scaling": "adascale"}


def test_adaptive_batch_grows_only_after_patience_checks():
    sim = Sim(AdaptiveBatchSize(max_batch=1024, patience=3, cooldown=0),
              hparams=ADASCALE)
    sim.train(2, gns=100.0)  # desired 100 >= 2 x 32 on two checks: not yet
    assert sim.changes("batch_size") == []
    sim.train(20, gns=100.0)
    # Third check at step 2, effective at 3; 100 < 2 x 64 so no further growth.
    assert sim.changes("batch_size") == [(3, 64)]
    (_, _, change), = sim.applied
    assert "noise scale 100" in change.reason and "32 -> 64" in change.reason


def test_adaptive_batch_waits_out_its_cooldown_from_the_applied_step():
    sim = Sim(AdaptiveBatchSize(max_batch=1 << 20, patience=1, cooldown=50),
              hparams=ADASCALE)
    sim.train(120, gns=1e6)
    assert sim.changes("batch_size") == [(1, 64), (52, 128), (103, 256)]


def test_adaptive_batch_checks_in_the_cooldown_do_not_count():
    sim = Sim(AdaptiveBatchSize(max_batch=1 << 20, patience=3, cooldown=10),
              hparams=ADASCALE)
    sim.train(30, gns=1e6)
    # Steps 0-2 -> effective 3; cooldown until 13, then three checks 13-15 -> effective 16.
    assert sim.changes("batch_size") == [(3, 64), (16, 128), (29, 256)]


def test_adaptive_batch_respects_the_unit_and_never_passes_max_batch():
    sim = Sim(AdaptiveBatchSize(max_batch=200, patience=1, cooldown=0),
              hparams={"batch_size": 32, "micro_batch": 8}, world_size=4)
    sim.train(40, gns=1e9)
    sizes = [b for _, b in sim.changes("batch_size")]
    assert sizes == [64, 128, 192]  # 256 capped to 200, rounded down to a multiple of 4 x 8
    assert sim.hp["batch_size"] == 192


def test_adaptive_batch_caps_at_the_specs_high_bound():
    sim = Sim(AdaptiveBatchSize(max_batch=4096, patience=1, cooldown=0))
    sim.ps.observe_status({}, specs={"batch_size": {"kind": "int", "low": 1, "high": 100}})
    sim.train(20, gns=1e9)
    assert [b for _, b in sim.changes("batch_size")] == [64, 100]


def test_adaptive_batch_does_not_flap_on_a_noisy_estimate():
    def gns(step: int) -> float:
        return 90.0 if step % 2 else 40.0  # around the threshold 2 x 32 = 64

    sim = Sim(AdaptiveBatchSize(max_batch=1024, patience=3, cooldown=0,
                                allow_decrease=True))
    sim.train(100, gns=gns)
    assert sim.changes("batch_size") == []
    # The same stream without hysteresis does change it: the check above means something.
    sim = Sim(AdaptiveBatchSize(max_batch=1024, patience=1, cooldown=0))
    sim.train(100, gns=gns)
    assert sim.changes("batch_size")


def test_adaptive_batch_ignores_missing_non_finite_and_negative_estimates():
    stream = [100.0, NAN, 100.0, -3.0, None, 0.0, float("inf"), 100.0]
    sim = Sim(AdaptiveBatchSize(max_batch=1024, patience=3, cooldown=0))
    sim.train(len(stream), gns=lambda s: stream[s])
    # The bad ones neither count nor break the streak: the third good one (step 7) decides.
    assert sim.changes("batch_size") == []
    assert sim.pending and sim.pending[0][1].change.values == {"batch_size": 64}
    assert not sim.notices("failed")


def test_adaptive_batch_shrinks_only_when_allowed_and_not_below_min_batch():
    sim = Sim(AdaptiveBatchSize(max_batch=1024, patience=1, cooldown=0),
              hparams={"batch_size": 256})
    sim.train(10, gns=10.0)
    assert sim.changes("batch_size") == []
    sim = Sim(AdaptiveBatchSize(max_batch=1024, min_batch=64, patience=1, cooldown=0,
                                allow_decrease=True), hparams={"batch_size": 256})
    sim.train(10, gns=10.0)
    assert [b for _, b in sim.changes("batch_size")] == [128, 64]


# ---- warmup ---------------------------------------------------------------------------------

def test_warmup_reaches_exactly_the_target_lr_and_then_stays_quiet():
    sim = Sim(Warmup(steps=10, start_factor=0.1), hparams={"lr": 0.3})
    sim.train(12)
    lrs = [lr for _, lr in sim.changes("lr")]
    assert lrs[0] == pytest.approx(0.03)
    assert lrs == sorted(lrs) and len(lrs) > 5
    assert lrs[-1] == 0.3  # exactly, not 0.30000000000000004
    for step, lr in sim.changes("lr")[1:]:  # decided at step - 1: lr x f(step - 1)
        assert lr == pytest.approx(0.3 * (0.1 + 0.9 * min(1.0, (step - 1) / 10)))
    n = len(sim.applied)
    sim.train(50)
    assert len(sim.applied) == n


def test_warmup_skips_changes_below_min_rel_change_but_lands_exactly():
    sim = Sim(Warmup(steps=1000, start_factor=0.5, min_rel_change=0.05), hparams={"lr": 1.0})
    sim.train(1002)
    lrs = [lr for _, lr in sim.changes("lr")]
    assert 10 < len(lrs) < 20  # 1.05 ** 15 ~ 2: about 15 changes, not 1000
    assert all(b / a >= 1.05 for a, b in pairwise(lrs[:-1]))
    assert lrs[-1] == 1.0


def test_warmup_composes_with_a_manual_change_after_enable():
    sim = Sim(Warmup(steps=10, start_factor=0.1), hparams={"lr": 0.1})
    sim.train(5)
    sim.set(lr=0.2)
    before = sim.changes("lr")[-1][1]  # the warmup's last lr before the person's change
    assert sim.notices("suspended")
    n = len(sim.applied)
    sim.train(3)
    assert len(sim.applied) == n  # suspended: the person's value stands
    sim.ps.enable("warmup")
    sim.train(10)
    # The warmup's remaining factor applies on top of the person's lr.
    assert sim.hp["lr"] == pytest.approx(0.2 * 0.1 / before)


# ---- schedules ----------------------------------------------------------------------------

def test_cosine_schedule_ends_at_min_factor_times_lr():
    sim = Sim(Schedule(kind="cosine", total_steps=50, min_factor=0.1), hparams={"lr": 0.1})
    sim.train(56)
    lrs = [lr for _, lr in sim.changes("lr")]
    assert lrs == sorted(lrs, reverse=True) and len(lrs) > 20
    for step, lr in sim.changes("lr"):  # decided at step - 1
        f = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - 1) / 50)))
        assert lr == pytest.approx(0.1 * f)
    assert lrs[-1] == pytest.approx(0.01, rel=1e-12)
    assert sim.changes("lr")[-1][0] == 51  # the final change at total_steps
    n = len(sim.applied)
    sim.train(20)
    assert len(sim.applied) == n


def test_cosine_to_zero_keeps_a_finite_positive_lr():
    sim = Sim(Schedule(kind="cosine", total_steps=20), hparams={"lr": 1.0})
    sim.train(30)
    assert 0 < sim.hp["lr"] <= 1e-6 * 1.0001
    assert not sim.notices("failed")


def test_step_schedule_decays_at_each_milestone():
    sim = Sim(Schedule(kind="step", milestones=[20, 10], gamma=0.1), hparams={"lr": 1.0})
    sim.train(40)
    assert sim.changes("lr") == [(11, pytest.approx(0.1)), (21, pytest.approx(0.01))]


def test_warmup_composes_with_lr_scaling_without_suspending():
    sim = Sim(Warmup(steps=10), hparams={"lr": 0.1})
    sim.train(5)
    sim.apply_due()
    sim.system("lr_scaling", lr=sim.hp["lr"] * 2)  # the batch doubled under linear scaling
    sim.train(10)
    assert not sim.notices("suspended")
    assert sim.hp["lr"] == pytest.approx(0.2)


def test_warmup_and_schedule_deciding_at_the_same_step_compose():
    sim = Sim(Warmup(steps=10), Schedule(kind="step", milestones=[5], gamma=0.5),
              hparams={"lr": 0.1})
    sim.train(20)
    assert sim.hp["lr"] == pytest.approx(0.05)


# ---- plateau and early stopping ------------------------------------------------------------

def flat_after(n: int, value: float = 1.0) -> Callable[[int], float]:
    return lambda s: float(n - s) + value if s < n else value


def test_plateau_reduces_after_patience_checks_and_respects_min_lr():
    sim = Sim(ReduceOnPlateau(patience=3, factor=0.1, min_lr=0.005), hparams={"lr": 0.1})
    sim.train(13, loss=flat_after(10))
    assert sim.changes("lr") == []  # best at step 10; 11 and 12 are two checks
    sim.train(1, loss=flat_after(10))
    sim.train(1, loss=flat_after(10))
    assert sim.changes("lr") == [(14, pytest.approx(0.01))]
    (_, _, change), = sim.applied
    assert "loss" in change.reason and "3 checks" in change.reason
    sim.train(30, loss=flat_after(10))
    assert [lr for _, lr in sim.changes("lr")] == [pytest.approx(0.01), 0.005]


def test_plateau_checks_evaluations_when_they_report_the_metric():
    sim = Sim(ReduceOnPlateau(metric="val_acc", mode="max", patience=2, factor=0.5),
              hparams={"lr": 0.1})
    for acc in (0.5, 0.6, 0.7, 0.69, 0.7):
        sim.train(10, loss=1.0)
        sim.evaluate(val_acc=acc)
    sim.train(1)
    assert sim.changes("lr") == [(50, pytest.approx(0.05))]


def test_plateau_checks_only_evaluations_once_they_report_the_metric():
    sim = Sim(ReduceOnPlateau(metric="loss", patience=2, factor=0.5), hparams={"lr": 1.0})
    sim.train(1, loss=1.0)
    sim.evaluate(loss=0.5)
    sim.train(10, loss=1.0)  # worse than 0.5, but training losses no longer count
    assert sim.changes("lr") == []
    sim.evaluate(loss=0.6)
    sim.evaluate(loss=0.55)
    sim.train(1, loss=1.0)
    assert sim.changes("lr") == [(11, 0.5)]


def test_plateau_ignores_non_finite_values_and_honours_cooldown():
    sim = Sim(ReduceOnPlateau(patience=2, factor=0.5, cooldown=3), hparams={"lr": 1.0})
    sim.train(20, loss=lambda s: NAN if s % 2 else 1.0)
    # Ten finite checks at 1.0: best, then bad at 2 and 4 -> reduce (effective 5); cooldown of
    # three checks (6, 8, 10), then bad at 12, 14 -> reduce (effective 15).
    assert [s for s, _ in sim.changes("lr")] == [5, 15]


def test_early_stopping_stops_after_patience_evaluations_without_improvement():
    sim = Sim(EarlyStopping(patience=3, min_delta=0.01))
    for v in (1.0, 0.9, 0.895, 0.95):  # 0.895 is within min_delta: no improvement
        sim.train(5, loss=0.1)
        sim.evaluate(val_loss=v)
    sim.train(1)
    assert sim.actions() == []
    sim.evaluate(val_loss=0.92)
    sim.train(1)
    assert sim.actions() == [("stop", None)]
    assert "val_loss" in sim.applied[-1][2].reason
    sim.evaluate(val_loss=2.0)
    sim.train(5)
    assert len(sim.actions()) == 1


def test_early_stopping_on_a_training_metric_in_max_mode():
    sim = Sim(EarlyStopping(metric="acc", mode="max", patience=2), every=5)
    sim.train(40, acc=lambda s: min(s, 12) / 100)
    assert sim.actions() == [("stop", None)]
    # Means of the records since the previous check rise until step 20 (12 > 11.8 at 15);
    # the checks at 25 and 30 show none: effective at 31.
    assert sim.applied[0][0] == 31


# ---- divergence guard ----------------------------------------------------------------------

def test_guard_rolls_back_to_the_last_good_step_with_a_lower_lr():
    sim = Sim(DivergenceGuard(lr_factor=0.5), hparams={"lr": 0.2})
    sim.train(25, loss=lambda s: NAN if s == 20 else 1.0)
    assert sim.actions() == [("rollback", 19)]
    assert sim.changes("lr") == [(21, pytest.approx(0.1))]
    assert "step 20" in sim.applied[0][2].reason


def test_guard_detects_an_exploding_loss_only_with_a_baseline():
    sim = Sim(DivergenceGuard(explode=10.0))
    sim.train(4, loss=lambda s: 100.0 if s == 3 else 1.0)  # three losses: no baseline yet
    sim.train(20, loss=lambda s: 15.0 if s == 20 else 1.0 + 0.01 * s)
    assert sim.actions() == [("rollback", 19)]


def test_guard_ignores_records_made_before_its_rollback_took_effect():
    sim = Sim(DivergenceGuard(max_rollbacks=1), delay=5)
    sim.train(40, loss=lambda s: NAN if 20 <= s < 25 else 1.0)
    assert sim.actions() == [("rollback", 19)]


def test_guard_stops_after_max_rollbacks():
    sim = Sim(DivergenceGuard(max_rollbacks=2), hparams={"lr": 1.0})
    sim.train(30, loss=lambda s: NAN if s >= 20 else 1.0)
    assert sim.actions() == [("rollback", 19), ("rollback", 19), ("stop", None)]
    assert sim.hp["lr"] == pytest.approx(0.25)
    assert "2 rollbacks" in sim.applied[-1][2].reason


def test_guard_exposes_snapshot_every():
    assert create("divergence_guard", {"snapshot_every": 25}).snapshot_every == 25


# ---- the registry ---------------------------------------------------------------------------

def test_registry_names_every_builtin():
    assert set(REGISTRY) == {"adaptive_batch", "goodput", "warmup", "schedule",
                             "reduce_on_plateau", "early_stopping", "divergence_guard",
                             "scale_workers"}
    assert all(cls.name == name for name, cls in REGISTRY.items())
    p = create("adaptive_batch", {"max_batch": 1024})
    assert isinstance(p, AdaptiveBatchSize) and p.policy_name == "adaptive_batch"


@pytest.mark.parametrize(("name", "params", "words"), [
    ("adaptive_batchh", {}, ["adaptive_batchh", "adaptive_batch", "warmup"]),
    ("adaptive_batch", {}, ["max_batch", "missing"]),
    ("adaptive_batch", {"max_batch": 1024, "maxbatch": 3}, ["maxbatch", "accepted",
                                                            "max_batch", "patience"]),
    ("adaptive_batch", {"max_batch": "big"}, ["max_batch", "integer", "'big'"]),
    ("adaptive_batch", {"max_batch": 64, "factor": 1}, ["factor", ">= 2"]),
    ("adaptive_batch", {"max_batch": 64, "min_batch": 128}, ["min_batch", "max_batch"]),
    ("adaptive_batch", {"max_batch": 64, "lr_scaling": "cubic"}, ["lr_scaling", "sqrt"]),
    ("adaptive_batch", {"max_batch": 64, "allow_decrease": "yes"}, ["allow_decrease"]),
    ("warmup", {"steps": 0}, ["steps", ">= 1"]),
    ("warmup", {"steps": 10, "start_factor": 0}, ["start_factor", "> 0", "<= 1"]),
    ("warmup", {"steps": 10, "start_factor": NAN}, ["start_factor", "finite"]),
    ("schedule", {"kind": "linear"}, ["kind", "step", "cosine"]),
    ("schedule", {"kind": "cosine"}, ["total_steps"]),
    ("schedule", {"kind": "cosine", "total_steps": 10, "milestones": [3]}, ["milestones"]),
    ("schedule", {"kind": "step", "milestones": []}, ["milestones", "non-empty"]),
    ("schedule", {"kind": "step", "milestones": [3, -1]}, ["milestones", ">= 0"]),
    ("reduce_on_plateau", {"factor": 1.0}, ["factor", "< 1"]),
    ("reduce_on_plateau", {"mode": "up"}, ["mode", "min", "max"]),
    ("early_stopping", {"metric": ""}, ["metric"]),
    ("divergence_guard", {"explode": 0.5}, ["explode", "> 1"]),
])
def test_create_rejects_bad_input_clearly(name, params, words):
    with pytest.raises(InvalidCommand) as e:
        create(name, params)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_create_names_the_field_and_accepts_json_numbers():
    with pytest.raises(InvalidCommand) as e:
        create("adaptive_batch", {"max_batch": 64, "patience": 0})
    assert e.value.field == "patience" and str(e.value).startswith("adaptive_batch: ")
    assert create("warmup", {"steps": 100.0}).steps == 100
    with pytest.raises(InvalidCommand):
        create("warmup", {"steps": 10.5})


# ---- state round trip ----------------------------------------------------------------------

def _records(n: int, **fields: Callable[[int], Any]) -> list[dict[str, Any]]:
    return [{"step": s, "epoch": 0, **{k: f(s) for k, f in fields.items()}} for s in range(n)]


def _run(policy: Policy, records: list[dict[str, Any]], start: int, hp: dict[str, Any],
         begin: bool) -> list[Any]:
    """Hooks on records[start:], with the earlier ones as history; changes apply at once."""
    out: list[Any] = []
    applied_at: list[int | None] = [None]

    def ctx(i: int) -> Context:
        train = [r for r in records[:i + 1] if not r.get("eval")]
        evals = [r for r in records[:i + 1] if r.get("eval")]
        return Context(step=records[i]["step"], epoch=0, hparams=hp,
                       metrics=train[-1] if train else {}, history=train[-4:],
                       evals=evals, applied_at=applied_at[0])

    def took(result: Any, i: int) -> None:
        out.append(result)
        if isinstance(result, Change):
            hp.update(result.values)
            applied_at[0] = records[i]["step"] + 1

    if begin:
        took(policy.on_start(ctx(start)), start)
    for i in range(start, len(records)):
        hook = policy.on_eval if records[i].get("eval") else policy.on_step
        took(hook(ctx(i)), i)
    return out


def _evals(values: list[float]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in values:
        out += _records(3, loss=lambda s: 1.0)
        out.append({"step": 0, "eval": True, "val_loss": v})
    for i, r in enumerate(out):
        r["step"] = i
    return out


ROUND_TRIPS = [
    ("adaptive_batch", {"max_batch": 1024, "patience": 3, "cooldown": 0},
     _records(8, gns=lambda s: 100.0), 2),
    ("warmup", {"steps": 10}, _records(14, loss=lambda s: 1.0), 4),
    ("schedule", {"kind": "cosine", "total_steps": 20}, _records(24, loss=lambda s: 1.0), 8),
    ("reduce_on_plateau", {"patience": 3}, _records(20, loss=flat_after(5)), 7),
    ("early_stopping", {"patience": 3}, _evals([1.0, 0.9, 0.95, 0.95, 0.96, 0.97]), 13),
    ("divergence_guard", {}, _records(20, loss=lambda s: 50.0 if s == 15 else 1.0), 13),
]


@pytest.mark.parametrize(("name", "params", "records", "k"), ROUND_TRIPS,
                         ids=[t[0] for t in ROUND_TRIPS])
def test_state_dict_round_trips_every_decision(name, params, records, k):
    def hp() -> dict[str, Any]:
        return {"lr": 0.1, "batch_size": 32, "monitor_gns": 1}

    full = _run(create(name, params), records, 0, hp(), begin=True)
    assert any(full[k + 1:]), "the stream must lead to a decision after the split"
    first, hp1 = create(name, params), hp()
    head = _run(first, records[:k], 0, hp1, begin=True)
    state = json.loads(json.dumps(first.state_dict(), allow_nan=False))
    second = create(name, params)
    second.load_state_dict(state)
    assert second.state_dict() == state
    hp2 = dict(hp1)
    assert head + _run(second, records, k, hp1, begin=False) == full
    # Without the state the policy decides otherwise: the comparison above means something.
    assert _run(create(name, params), records, k, hp2, begin=False) != full[k + 1:]
