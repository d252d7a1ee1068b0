"""Smoothing and decimation of plotted series (numpy only; no kernel needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpinteract.client.decimate import ema, minmax, window


def loop_ema(y, alpha):
    out, s, n = [], 0.0, 0
    for v in y:
        if not math.isfinite(v):
            out.append(v)
            continue
        s = alpha * s + (1 - alpha) * v
        n += 1
        out.append(s / (1 - alpha**n))
    return np.array(out)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9, 0.99, 0.999])
def test_the_blocked_ema_equals_the_recurrence(alpha):
    y = np.random.default_rng(0).normal(size=1000).cumsum()
    got, state = ema(y, alpha)
    np.testing.assert_allclose(got, loop_ema(y, alpha), rtol=1e-9, atol=1e-9)
    assert state.n == 1000


def test_the_ema_is_debiased_and_skips_non_finite_points():
    got, _ = ema(np.array([5.0, float("nan"), 5.0, float("inf"), 5.0]), 0.9)
    assert got[0] == pytest.approx(5.0)  # not pulled towards 0
    assert math.isnan(got[1]) and math.isinf(got[3])
    np.testing.assert_allclose(got[[0, 2, 4]], 5.0)


def test_the_ema_continues_from_its_state():
    y = np.random.default_rng(1).normal(size=300)
    whole, end = ema(y, 0.95)
    a, st = ema(y[:123], 0.95)
    b, st2 = ema(y[123:], 0.95, st)
    np.testing.assert_allclose(np.concatenate([a, b]), whole, rtol=1e-12)
    assert st2.n == end.n == 300 and st2.value == pytest.approx(end.value, rel=1e-12)


def test_a_bad_smoothing_value_is_refused():
    with pytest.raises(ValueError, match="smoothing"):
        ema(np.ones(3), 1.0)


def test_minmax_keeps_first_last_and_every_spike():
    rng = np.random.default_rng(2)
    y = rng.normal(size=1_000_000)
    spikes = [17, 333_333, 777_777]
    y[spikes[0]], y[spikes[1]], y[spikes[2]] = 50.0, -60.0, float("nan")
    idx = minmax(y, 500)
    assert len(idx) <= 2 * 500 + 2
    assert idx[0] == 0 and idx[-1] == len(y) - 1
    assert set(spikes) <= set(idx.tolist())
    assert np.all(np.diff(idx) > 0)
    # Every bucket's extremes are kept: the decimated range equals the full range.
    finite = y[idx][np.isfinite(y[idx])]
    assert finite.max() == np.nanmax(y) and finite.min() == np.nanmin(y)


def test_minmax_returns_everything_when_it_is_short():
    assert minmax(np.arange(10.0), 5).tolist() == list(range(10))
    with pytest.raises(ValueError, match="buckets"):
        minmax(np.arange(10.0), 0)


def test_window_adds_one_neighbour_each_side():
    x = np.arange(100.0)
    assert window(x, 10, 20).tolist() == list(range(9, 22))
    assert window(x, None, None).tolist() == list(range(100))
    assert window(x, 200, 300).tolist() == []
