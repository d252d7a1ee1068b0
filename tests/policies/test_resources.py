"""ScaleWorkers on scripted metric streams: it steps up while samples/s scale, undoes a step
up that does not pay and rests, measures each size only once it has settled, and keeps its
decision across a restart (its state is saved with checkpoints)."""

from __future__ import annotations

import pytest

from hpinteract.policies import REGISTRY, Context, ScaleWorkers, create
from hpinteract.protocol.errors import InvalidCommand


def ctx(step: int, workers: int, rate: float, since: int, applied_at: int | None) -> Context:
    history = [{"step": s, "samples_per_s": rate} for s in range(since, step + 1)]
    return Context(step=step, epoch=0, hparams={"workers": workers}, metrics=history[-1],
                   history=history, applied_at=applied_at)


def test_it_steps_up_while_throughput_scales_and_rests_at_the_cap():
    p = ScaleWorkers(max_workers=4, window=5, settle=2)
    assert p.on_step(ctx(5, 1, 100.0, 0, None)) is None  # 4 settled records: not enough
    up = p.on_step(ctx(6, 1, 100.0, 0, None))
    assert up is not None and up.values == {"workers": 2} and "trying 2" in up.reason
    assert p.on_step(ctx(11, 2, 190.0, 7, 6)) is None  # steps 8..11 since it settled: 4
    up = p.on_step(ctx(12, 2, 190.0, 7, 6))
    assert up is not None and up.values == {"workers": 4}
    assert p.on_step(ctx(40, 4, 380.0, 20, 19)) is None  # 8 would be over the cap: rest
    assert p.on_step(ctx(80, 4, 380.0, 20, 19)) is None


def test_a_step_up_that_does_not_pay_is_undone():
    p = ScaleWorkers(max_workers=8, window=5, settle=0, min_gain=0.1)
    assert p.on_step(ctx(10, 1, 100.0, 0, None)).values == {"workers": 2}
    back = p.on_step(ctx(30, 2, 105.0, 20, 20))  # 5 % more: not the 10 % asked for
    assert back is not None and back.values == {"workers": 1}
    assert "back to 1" in back.reason and "105" in back.reason
    assert p.on_step(ctx(60, 1, 100.0, 40, 40)) is None  # resting: no flapping


def test_its_decision_survives_a_restart_and_bad_input_is_refused():
    p = ScaleWorkers(max_workers=8, window=5, settle=0)
    p.on_step(ctx(10, 1, 100.0, 0, None))
    q = ScaleWorkers(max_workers=8, window=5, settle=0)
    q.load_state_dict(p.state_dict())  # the job restarted with 2 ranks
    assert q.on_step(ctx(20, 2, 90.0, 15, None)).values == {"workers": 1}
    assert REGISTRY["scale_workers"] is ScaleWorkers
    assert isinstance(create("scale_workers", {"max_workers": 4}), ScaleWorkers)
    with pytest.raises(InvalidCommand, match="max_workers"):
        create("scale_workers", {"max_workers": 0})
    with pytest.raises(InvalidCommand, match="bad saved state"):
        q.load_state_dict({"before": "x"})
