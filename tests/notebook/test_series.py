"""What a plotted line holds: bounded, first and last points and spikes kept, new points
streamed until it is time to decimate again (numpy only)."""

from __future__ import annotations

import numpy as np

from hpinteract.client.bulk import columns
from hpinteract.notebook.series import Series, SeriesView


def test_a_view_streams_then_redecimates_and_stays_within_budget():
    s = Series("loss")
    view = SeriesView(s, budget=200)
    rng = np.random.default_rng(0)
    shown: list[float] = []
    hows = []
    step = 0
    for chunk in range(300):  # 300 ticks of 37 new points: 11,100 points in all
        xs = np.arange(step, step + 37, dtype=float)
        ys = rng.normal(size=37)
        if chunk == 123:
            ys[5] = 99.0  # a spike
        s.extend(xs, ys)
        step += 37
        how, data = view.update()
        hows.append(how)
        shown = list(data["x"]) if how == "replace" else shown + list(data["x"])
        assert len(shown) <= 200 + 2
    assert "stream" in hows and "replace" in hows
    assert shown[0] == 0.0  # the first point survives every re-decimation
    assert shown[-1] == float(step - 1)
    assert 123 * 37 + 5 in shown  # so does the spike
    assert view.update() is None  # nothing new


def test_a_zoomed_view_is_decimated_within_its_window_and_ignores_new_points():
    s = Series("loss")
    s.extend(np.arange(100_000.0), np.sin(np.arange(100_000.0) / 1000))
    view = SeriesView(s, budget=400)
    view.start, view.end = 10_000.0, 20_000.0
    data = view.full()
    x = np.asarray(data["x"])
    inside = x[(x >= 10_000) & (x <= 20_000)]
    assert len(inside) > 150  # the window gets (nearly) the whole budget
    assert x[0] == 0.0 and x[-1] == 99_999.0  # the extent, so a reset sees everything
    s.extend([100_000.0], [0.0])
    assert view.update() is None  # a zoomed view does not follow the tail


def test_smoothing_draws_the_smoothed_line_and_keeps_the_raw_values():
    s = Series("loss")
    s.extend(np.arange(10.0), [1.0, 3.0] * 5)
    view = SeriesView(s, budget=100, smoothing=0.9)
    data = view.full()
    assert list(data["raw"]) == [1.0, 3.0] * 5
    assert max(data["y"]) < 3.0 and min(data["y"][1:]) > 1.0


def test_columns_takes_numbers_only():
    recs = [{"seq": 1, "step": 0, "loss": 1.5, "eval": True, "note": "x", "n": 3},
            {"seq": 2, "loss": 2.0}, {"seq": 3, "step": 1, "loss": 1.0}]
    assert columns(recs) == {"loss": ([0.0, 1.0], [1.5, 1.0]), "n": ([0.0], [3.0])}
    assert columns(recs, {"n"}) == {"n": ([0.0], [3.0])}


def test_a_rewind_takes_away_the_steps_a_job_runs_again():
    s = Series("loss")
    s.extend(np.arange(100.0), np.arange(100.0))
    view = SeriesView(s, budget=400)
    view.full()
    assert s.keep_before(60) and not s.keep_before(60)
    s.extend(np.arange(60.0, 81.0), -np.arange(60.0, 81.0))  # run again, other values
    data = view.full()
    assert list(s.x) == list(range(81)) and list(data["x"]) == list(range(81))
    assert data["raw"][-1] == -80 and data["raw"][59] == 59
