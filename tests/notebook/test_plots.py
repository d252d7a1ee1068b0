"""LivePlots without a browser: a resumed or restarted job's rewind takes the steps it
runs again out of the drawn lines, and the points that come after are drawn once."""

from __future__ import annotations

import numpy as np

from hpinteract.notebook.plots import LivePlots


def test_a_rewind_redraws_the_lines_without_the_steps_run_again():
    plots = LivePlots(budget=400)
    plots.add_points("loss", np.arange(100.0), np.ones(100))
    plots.add_points("lr", np.arange(100.0), np.full(100, 0.1))
    plots.pump()
    assert plots.point_counts() == {"loss": 100, "lr": 100}
    plots.rewind(60)
    plots.add_points("loss", np.arange(60.0, 70.0), np.zeros(10))
    plots.pump()
    assert plots.point_counts() == {"loss": 70, "lr": 60}
    x = list(plots._sources["loss"].data["x"])
    assert x == list(range(70))  # each step once, in order
    assert list(plots._sources["loss"].data["raw"][60:]) == [0.0] * 10
