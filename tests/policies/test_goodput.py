"""The goodput policy on scripted jobs whose step time follows a known cost model: the
fitted model recovers the costs, the batch goes to the goodput optimum that the model and
the noise scale imply, a switch needs a real gain, accumulation comes in where a rank's
micro-batch is capped, and the policy's measurements are reported."""

from __future__ import annotations

import math

import pytest
from policy_sim import Sim

from hpinteract.policies import Goodput, create
from hpinteract.policies.goodput import MEASURED, TRUST, StepTimeModel, efficiency
from hpinteract.protocol.errors import InvalidCommand

ALPHA, BETA, DELTA = 4e-3, 20e-6, 1e-3  # a micro-batch, a sample, a step (seconds)


def step_time(hp: dict, world: int = 2) -> float:
    local = hp["batch_size"] // world
    micro = hp.get("micro_batch") or local
    return local // micro * (ALPHA + BETA * micro) + DELTA


def test_efficiency_is_one_at_the_start_and_falls_past_the_noise_scale() -> None:
    assert efficiency(64, 64, 1000.0) == 1.0
    assert efficiency(1064, 64, 1000.0) == pytest.approx(1064 / 2064)
    assert efficiency(4096, 64, 10.0) < 0.02


def test_the_model_recovers_known_costs_and_says_only_what_it_measured() -> None:
    def measured(*configs: tuple[int, int]) -> StepTimeModel:
        model = StepTimeModel()
        for m, s in configs:
            for _ in range(MEASURED):
                model.observe(m, s, s * (ALPHA + BETA * m) + DELTA)
        return model

    assert StepTimeModel().fit() is None
    fit = measured((32, 1), (64, 1), (32, 2), (128, 4)).fit()
    assert fit == pytest.approx((ALPHA, BETA, DELTA))
    # One accumulation count: the fixed cost is told apart from the cost a sample, and
    # split evenly between the micro-batch and the step.
    fixed = ALPHA + DELTA
    assert measured((32, 1), (128, 1)).fit() == pytest.approx((fixed / 2, BETA, fixed / 2))
    # One configuration: half fixed, half by sample.
    t = ALPHA + BETA * 32 + DELTA
    assert measured((32, 1)).fit() == pytest.approx((t / 4, t / 64, t / 4))
    # A time that does not grow with the micro-batch: no cost a sample, never a negative one.
    flat = StepTimeModel()
    for m in (16, 64):
        for _ in range(MEASURED):
            flat.observe(m, 1, 0.01)
    assert flat.fit() == pytest.approx((0.005, 0.0, 0.005))


def optimum(noise: float, start: int, world: int = 2) -> float:
    """The batch of the highest goodput without accumulation: d/dM of
    M / (a + b M / world) * (phi + M0) / (phi + M) is 0 at M = sqrt(phi a world / b)."""
    return math.sqrt(noise * (ALPHA + DELTA) * world / BETA)


def test_the_batch_goes_to_the_goodput_optimum_and_stays() -> None:
    noise = 2000.0
    sim = Sim(Goodput(max_batch=8192, interval=50), world_size=2,
              hparams={"batch_size": 64, "lr_scaling": "adascale"})
    sim.train(1500, step_time=lambda s: step_time(sim.hp), gns=noise)
    batches = sim.changes("batch_size")
    best = optimum(noise, 64)
    assert 0.8 * best <= sim.hp["batch_size"] <= 1.25 * best, (batches, best)
    assert len(batches) <= 3  # then no switch: the rest is within 5 %
    assert batches[-1][0] < 300
    applied = [c for _, name, c in sim.applied if name == "goodput" and "batch_size" in c.values]
    assert all(c.reason.startswith("goodput ") and "predicted" in c.reason for c in applied)


def test_the_batch_climbs_at_most_trust_times_what_was_measured() -> None:
    # A step time that does not grow with the batch (as a noisy pair of medians can make
    # it look): the fitted line says any batch is free, the optimum is max_batch. The
    # policy gets there in measured steps of at most TRUST x the largest micro-batch.
    sim = Sim(Goodput(max_batch=8192, interval=50), world_size=2,
              hparams={"batch_size": 64, "micro_batch": 32, "lr_scaling": "adascale"})
    sim.train(600, step_time=0.01, gns=1e7)
    micros = [32] + [m for _, m in sim.changes("micro_batch")]
    assert micros[-1] == 4096, micros
    assert len(micros) >= 4
    for i in range(1, len(micros)):
        assert micros[i] <= TRUST * max(micros[:i]), micros


def test_no_switch_for_a_gain_below_min_gain() -> None:
    # At the optimum already: nothing it can find is 5 % better.
    start = 2 * round(optimum(2000.0, 64) / 2)
    sim = Sim(Goodput(max_batch=8192, interval=50, min_batch=64), world_size=2,
              hparams={"batch_size": start, "lr_scaling": "adascale"})
    sim.train(200, step_time=lambda s: step_time(sim.hp), gns=2000.0)
    # The prior (half fixed, half by sample) may move it once; measured, it comes back or
    # stays near: never a series of switches.
    assert len(sim.changes("batch_size")) <= 2


def test_accumulation_where_a_ranks_micro_batch_is_capped() -> None:
    # A large noise scale: the best batch is past what a rank may hold at once (64).
    sim = Sim(Goodput(max_batch=2048, max_micro_batch=64, interval=50), world_size=2,
              hparams={"batch_size": 64, "micro_batch": 32, "lr_scaling": "adascale"})
    sim.train(1500, step_time=lambda s: step_time(sim.hp), gns=1e6)
    assert sim.hp["micro_batch"] <= 64
    assert sim.hp["batch_size"] > 2 * 64  # accumulating
    assert sim.hp["batch_size"] % (2 * sim.hp["micro_batch"]) == 0


def test_a_resize_starts_the_measurements_afresh() -> None:
    p = Goodput(max_batch=8192, interval=50)
    sim = Sim(p, world_size=2, hparams={"batch_size": 64, "lr_scaling": "adascale"})
    sim.train(40, step_time=lambda s: step_time(sim.hp), gns=2000.0)
    assert p.model.seen
    sim.ps.world_size = 4  # the host's view after a resize to 4 ranks
    sim.train(1, step_time=lambda s: step_time(sim.hp, 4), gns=2000.0)
    assert set(p.model.seen) <= {(sim.hp["batch_size"] // 4, 1)}
    assert all(len(v) <= 1 for v in p.model.seen.values())


def test_no_decision_without_a_positive_noise_scale() -> None:
    for gns in (None, -5.0, 0.0):
        sim = Sim(Goodput(max_batch=8192, interval=10), world_size=2,
                  hparams={"batch_size": 64, "lr_scaling": "adascale"})
        sim.train(300, step_time=lambda s, sim=sim: step_time(sim.hp), gns=gns)
        assert sim.changes("batch_size") == []


def test_start_asks_for_the_monitor_and_adascale() -> None:
    sim = Sim(Goodput(max_batch=512), hparams={"monitor_gns": 0})
    sim.train(1)
    assert sim.hp["monitor_gns"] == 1 and sim.hp["lr_scaling"] == "adascale"
    sim = Sim(Goodput(max_batch=512, lr_scaling="none", monitor_every=4),
              hparams={"monitor_gns": 0, "lr_scaling": "none"})
    sim.train(1)
    assert sim.hp["monitor_gns"] == 4 and sim.hp["lr_scaling"] == "none"


def test_the_report_and_the_state_round_trip() -> None:
    p = Goodput(max_batch=8192, interval=50)
    sim = Sim(p, world_size=2, hparams={"batch_size": 64, "lr_scaling": "adascale"})
    sim.train(120, step_time=lambda s: step_time(sim.hp), gns=2000.0)
    report = p.report()
    assert set(report) >= {"goodput", "goodput_efficiency", "goodput_step_fixed_s",
                           "goodput_sample_s"}
    assert 0 < report["goodput_efficiency"] <= 1
    assert sim.ps.reports() == report
    assert not any(k.startswith("goodput_workers_") for k in report)  # no workers knob


def test_with_workers_it_reports_what_half_and_twice_the_ranks_would_give() -> None:
    p = Goodput(max_batch=8192, interval=50)
    sim = Sim(p, world_size=2, hparams={"batch_size": 64, "lr_scaling": "adascale",
                                         "workers": 2})
    sim.train(120, step_time=lambda s: step_time(sim.hp), gns=2000.0)
    report = p.report()
    assert 0 < report["goodput_workers_1"] < report["goodput"] < report["goodput_workers_4"]
    assert sim.ps.describe()[0]["report"] == report
    again = Goodput(max_batch=8192, interval=50)
    again.load_state_dict(p.state_dict())
    assert again.start == p.start and again.model.fit() == p.model.fit()
    for bad in ({"seen": {"64": [0.01]}}, {"seen": {"ax2": [0.01]}}, {"seen": {"64x1": 0.01}},
                {"seen": [1, 2]}):
        with pytest.raises(InvalidCommand, match="goodput: bad saved"):
            Goodput(max_batch=8192).load_state_dict(bad)


@pytest.mark.parametrize(("params", "words"), [
    ({}, ["max_batch", "missing"]),
    ({"max_batch": 64, "min_batch": 128}, ["min_batch", "max_batch"]),
    ({"max_batch": 64, "min_gain": -0.1}, ["min_gain"]),
    ({"max_batch": 64, "max_micro_batch": 0}, ["max_micro_batch", ">= 1"]),
    ({"max_batch": 64, "lr_scaling": "cubic"}, ["lr_scaling", "adascale"]),
])
def test_bad_parameters_are_named(params, words) -> None:
    with pytest.raises(InvalidCommand) as e:
        create("goodput", params)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
