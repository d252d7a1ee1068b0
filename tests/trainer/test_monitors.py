"""The noise-scale monitor against hand computations: the estimator's formulas, the one-rank
paths (micro-batches; consecutive steps) and, in a real 2-rank DDP job, the gradient hooks."""

import json
import math

import pytest
import torch
from helpers import JOBS
from torch import nn

import hpinteract as hpi
from hpinteract.trainer.monitors import GNSMonitor, NoiseScale, share


def test_the_estimator_follows_mccandlish_and_smooths_the_two_sums_separately():
    est = NoiseScale()
    # |G|^2 = (16*2 - 4*5)/12 = 1; tr(S) = (5 - 2)/(1/4 - 1/16) = 16: B_simple = 16.
    est.add(5.0, 4, 2.0, 16, alpha=0.5)
    out = est.estimate()
    assert out["gns_grad_sq"] == pytest.approx(1.0) and out["gns_var"] == pytest.approx(16.0)
    assert out["gns"] == pytest.approx(16.0)
    # Second: |G|^2 = (16*1 - 4*4)/12 = 0, tr(S) = 3/(3/16) = 16. Debiased EMAs with 0.5:
    # |G|^2 = (0.5*0.5*1 + 0.5*0)/0.75 = 1/3, tr(S) = 16: the ratio of the means, 48 (the
    # mean of the ratios would be infinite).
    est.add(4.0, 4, 1.0, 16, alpha=0.5)
    out = est.estimate()
    assert out["gns_grad_sq"] == pytest.approx(1 / 3) and out["gns"] == pytest.approx(48.0)
    assert est.simple() == pytest.approx(48.0)


def test_adding_up_the_ranks_smoothed_terms_equals_smoothing_their_sums():
    # Two ranks, three steps, a batch size change in between and a smoothing change: the
    # ranks' mean of the EMAs of their small-norm terms and sum of those of their shares of
    # the big norm are the EMAs of the mean small norm's and the whole big norm's terms.
    steps = [((5.0, 3.0), (1.5, 0.5), 4, 8, 0.9), ((4.0, 6.0), (1.0, 0.5), 8, 16, 0.9),
             ((2.0, 2.5), (0.25, 0.75), 8, 16, 0.5)]
    ranks = [NoiseScale(), NoiseScale()]
    together = NoiseScale()
    for smalls, bigs, bs, bb, alpha in steps:
        for est, small, big in zip(ranks, smalls, bigs, strict=True):
            est.add(small, bs, big, bb, alpha)
        together.add(sum(smalls) / 2, bs, sum(bigs), bb, alpha)
    (t0, debias), (t1, _) = ranks[0].terms(), ranks[1].terms()
    combined = [(t0[0] + t1[0]) / 2, (t0[1] + t1[1]) / 2, t0[2] + t1[2], t0[3] + t1[3]]
    split = ranks[0].estimate(combined, debias)
    whole = together.estimate()
    for key in ("gns_grad_sq", "gns_var", "gns"):
        assert split[key] == pytest.approx(whole[key], rel=1e-12)
    # and the debias uses the product of the factors actually used: 1 - 0.9 * 0.9 * 0.5
    g2 = [(bb * sum(bg) - bs * sum(sm) / 2) / (bb - bs) for sm, bg, bs, bb, _ in steps]
    ema = 0.0
    for value, (*_, alpha) in zip(g2, steps, strict=True):
        ema = alpha * ema + (1 - alpha) * value
    assert whole["gns_grad_sq"] == pytest.approx(ema / (1 - 0.9 * 0.9 * 0.5))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("numel", [1, 2, 7, 4096])
def test_the_ranks_shares_cover_each_gradient_once_in_near_equal_parts(numel, world):
    parts = [share(numel, r, world) for r in range(world)]
    covered = [i for p in parts for i in range(numel)[p]]
    assert covered == list(range(numel))
    lengths = [len(range(numel)[p]) for p in parts]
    assert max(lengths) - min(lengths) <= 1


def grads_of(model, x, y):
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()


def test_one_rank_with_accumulation_uses_each_micro_batch_as_a_small_batch():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    own = [grads_of(model, x[2 * i:2 * i + 2], y[2 * i:2 * i + 2]) for i in range(4)]
    g_all = grads_of(model, x, y)
    mon = GNSMonitor(model, list(model.parameters()), world=1, rank=0)
    mon.arm(0, every=1, accumulation=4)
    model.zero_grad()
    for i in range(4):
        (nn.functional.mse_loss(model(x[2 * i:2 * i + 2]), y[2 * i:2 * i + 2]) * 0.25).backward()
        mon.after_backward(i, 4, 0.25)
    out = mon.step_done(0, batch=8, micro=2, accumulation=4, alpha=0.9)
    small = sum(float(g.square().sum()) for g in own) / 4
    big = float(g_all.square().sum())
    assert out["grad_norm"] == pytest.approx(math.sqrt(big), rel=1e-5)
    assert out["gns_grad_sq"] == pytest.approx((8 * big - 2 * small) / 6, rel=1e-5)
    assert out["gns_var"] == pytest.approx((small - big) / (1 / 2 - 1 / 8), rel=1e-5)


def test_one_rank_without_accumulation_pairs_consecutive_steps():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    mon = GNSMonitor(model, list(model.parameters()), world=1, rank=0)
    batches = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(2)]
    seen = []
    for step, (x, y) in enumerate(batches):
        mon.arm(step, every=5, accumulation=1)  # steps 0 and 1 of every 5 form a pair
        assert mon.measuring
        seen.append(grads_of(model, x, y))  # no optimizer step: both at the same weights
        out = mon.step_done(step, batch=4, micro=4, accumulation=1, alpha=0.9)
    mon.arm(2, every=5, accumulation=1)
    assert not mon.measuring
    small = (float(seen[0].square().sum()) + float(seen[1].square().sum())) / 2
    big = float(((seen[0] + seen[1]) / 2).square().sum())
    assert out["gns_var"] == pytest.approx((small - big) / (1 / 4 - 1 / 8), rel=1e-5)


def test_two_ranks_average_their_own_gradients_norms_against_the_all_reduced_one(tmp_path):
    job = hpi.launch(JOBS / "gns_check.py", nproc=2, cwd=tmp_path)
    assert job.wait(120).value == "finished", job.error
    expected = json.loads((job.run_dir.path / "expected.json").read_text())
    m = job.metrics().set_index("step")
    assert len(expected) == len(m) == 50
    # The ranks' smoothed terms are combined asynchronously every REDUCE_EVERY steps (from
    # step 0): the estimate as of such a step, and its gradient norm (from the ranks'
    # shares of the all-reduced gradient), are published with the next step.
    every = GNSMonitor.REDUCE_EVERY
    published = sorted(m.index[m["gns"].notna()])
    assert published == [s + 1 for s in range(0, len(m) - 1, every)]
    assert sorted(m.index[m["grad_norm"].notna()]) == published
    g2 = s = 0.0
    for n, e in enumerate(expected, start=1):
        bs, bb = e["b_small"], e["b_big"]
        g2 = 0.9 * g2 + 0.1 * (bb * e["big"] - bs * e["small"]) / (bb - bs)
        s = 0.9 * s + 0.1 * (e["small"] - e["big"]) / (1 / bs - 1 / bb)
        debias = 1 - 0.9 ** n
        if e["step"] % every == 0 and e["step"] + 1 in m.index:
            row = m.loc[e["step"] + 1]
            assert row["grad_norm"] == pytest.approx(math.sqrt(e["big"]), rel=1e-4)
            assert row["gns_grad_sq"] == pytest.approx(g2 / debias, rel=1e-4)
            assert row["gns_var"] == pytest.approx(s / debias, rel=1e-4)
            assert row["gns"] == pytest.approx(s / g2, rel=1e-4)
