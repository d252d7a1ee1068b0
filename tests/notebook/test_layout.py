"""The dashboard's arrangement, without a browser (the browser test checks it drawn): the
loss first and across, the sections in order, a series that never changed as text, the
straggler ratio in the per-rank figure's title, one x range for all."""

from __future__ import annotations

import numpy as np
import pytest

from hpinteract.notebook import layout
from hpinteract.notebook.dashboard import change_label
from hpinteract.notebook.plots import LivePlots
from hpinteract.protocol.changes import Applied
from hpinteract.protocol.errors import ConfigError

STEPS = np.arange(100.0)


def placed(plots: LivePlots) -> list[tuple[object, ...]]:
    """(title, row, column) of each figure shown, (title, row, 0, 1, 2) for one alone
    across both columns."""
    out: list[tuple[object, ...]] = []
    for r, child in enumerate(plots.layout.children):
        if type(child).__name__ == "Row":
            out += [(f.name, r, c) for c, f in enumerate(child.children)
                    if type(f).__name__ == "figure"]
        else:
            out.append((child.name, r, 0, 1, 2))
    return out


def fed(**series: object) -> LivePlots:
    plots = LivePlots(budget=400, hparams=("lr", "batch_size", "dropout"))
    for name, ys in series.items():
        plots.add_points(name, STEPS, np.broadcast_to(np.asarray(ys, dtype=float), (100,)))
    plots.pump()
    return plots


def test_loss_first_across_then_learned_hparams_and_system_two_a_row() -> None:
    rng = np.random.default_rng(0)
    plots = fed(samples_per_s=rng.random(100), gns=rng.random(100), lr=np.r_[[0.1] * 50,
                [0.05] * 50], acc=np.linspace(0, 1, 100), loss=np.linspace(2, 0, 100),
                step_time_r0=rng.random(100), data_time_r1=rng.random(100),
                val_loss=np.linspace(2, 1, 100), my_metric=rng.random(100),
                batch_size=np.r_[[64] * 90, [128] * 10])
    assert placed(plots) == [
        ("loss", 0, 0, 1, 2),  # train and val together, the whole width
        ("accuracy", 1, 0), ("my_metric", 1, 1),
        ("learning rate", 2, 0), ("batch size", 2, 1),
        ("throughput (samples/s)", 3, 0), ("step and data time per rank (s)", 3, 1),
        ("gradient noise scale", 4, 0)]
    assert set(plots.figures["loss"].lines) == {"loss", "val_loss"}
    loss = plots.figures["loss"].fig
    assert loss.height > plots.figures["accuracy"].fig.height
    assert set(plots.figures["step and data time per rank (s)"].lines) == {
        "step_time_r0", "data_time_r1"}
    # zoom one, all follow: one x range object
    assert len({id(f.fig.x_range) for f in plots.figures.values()}) == 1
    assert plots.unchanged == ""


def test_what_never_changed_is_text_until_it_changes() -> None:
    plots = fed(loss=np.linspace(1, 0, 100), lr=0.1, batch_size=64.0, step_time=0.02)
    assert [p[0] for p in placed(plots)] == ["loss"]
    assert "unchanged so far" in plots.unchanged
    for shown in ("<b>batch_size</b> 64", "<b>lr</b> 0.1", "<b>step_time</b> 0.02"):
        assert shown in plots.unchanged
    plots.add_points("lr", [100.0], [0.01])
    plots.add_change(100.0, "lr 0.1 &rarr; 0.01", "lr")
    plots.pump()
    assert [p[0] for p in placed(plots)] == ["loss", "learning rate"]
    assert "<b>lr</b>" not in plots.unchanged and "<b>batch_size</b> 64" in plots.unchanged
    # the change is marked on the lr figure and on the loss
    for title in ("learning rate", "loss"):
        assert list(plots.figures[title].changes.data["x"]) == [100.0]


def test_hparams_are_step_lines_and_throughput_is_smoothed() -> None:
    rng = np.random.default_rng(1)
    plots = fed(loss=np.linspace(1, 0, 100), lr=np.r_[[0.1] * 50, [0.2] * 50],
                samples_per_s=1000 + rng.random(100))
    lr_glyphs = {type(r.glyph).__name__ for r in plots.figures["learning rate"].fig.renderers}
    assert "Step" in lr_glyphs
    src = plots._sources["samples_per_s"].data
    assert np.std(src["y"]) < np.std(src["raw"])  # smoothed by default; raw kept faint
    assert plots.figures["throughput (samples/s)"].raw["samples_per_s"].visible
    assert not plots.figures["loss"].raw["loss"].visible  # the slider's 0: loss unsmoothed
    plots.set_log(True)
    plots.pump()
    assert [p[0] for p in placed(plots)] == ["loss", "learning rate",
                                             "throughput (samples/s)"]


def test_straggler_ratio_in_the_per_rank_title() -> None:
    plots = fed(loss=np.linspace(1, 0, 100), step_time_r0=np.linspace(0.1, 0.2, 100),
                step_time_r1=np.linspace(0.1, 0.3, 100), straggler=1.5)
    fig = plots.figures["step and data time per rank (s)"].fig
    assert fig.title.text == "step and data time per rank (s) · straggler ratio 1.50"
    assert "straggler" not in plots.series  # in the title, not a line


def test_columns_one_for_a_narrow_cell_and_a_wrong_count_is_named() -> None:
    plots = LivePlots(budget=400, columns=1)
    for name in ("loss", "acc", "my_metric"):
        plots.add_points(name, STEPS, np.linspace(0, 1, 100))
    plots.pump()
    assert placed(plots) == [("loss", 0, 0, 1, 2), ("accuracy", 1, 0), ("my_metric", 2, 0)]
    for bad in (0, 5, 1.5, True, "2"):
        with pytest.raises(ConfigError, match=r"columns=.*: figures a row, an integer from "
                                              r"1 to 4"):
            LivePlots(columns=bad)


def test_the_goodput_policys_report_is_system_with_its_costs_hidden() -> None:
    rng = np.random.default_rng(0)
    plots = fed(loss=np.linspace(2, 0, 100), gns=rng.random(100), goodput=rng.random(100),
                goodput_best=rng.random(100), goodput_workers_4=rng.random(100),
                goodput_efficiency=rng.random(100), goodput_sample_s=rng.random(100),
                goodput_step_fixed_s=rng.random(100))
    assert placed(plots) == [("loss", 0, 0, 1, 2), ("gradient noise scale", 1, 0),
                             ("goodput (samples/s x efficiency)", 1, 1),
                             ("statistical efficiency", 2, 0)]
    assert set(plots.figures["goodput (samples/s x efficiency)"].lines) == {
        "goodput", "goodput_best", "goodput_workers_4"}


def test_ordered_and_grid_units() -> None:
    titles = ["gradient noise scale", "batch size", "loss", "acc2", "learning rate",
              "throughput (samples/s)"]
    assert layout.ordered(titles, {"batch size", "learning rate"}) == [
        "loss", "acc2", "learning rate", "batch size", "throughput (samples/s)",
        "gradient noise scale"]
    assert layout.varies(1.0, np.array([1.0, 1.0])) is False
    assert layout.varies(float("nan"), np.array([np.nan])) is False
    assert layout.varies(1.0, np.array([1.0, np.nan])) is True


def test_change_label_says_who_what_from_to_when_why_escaped() -> None:
    ev = Applied.of({"kind": "change", "status": "applied", "values": {"lr": 0.01},
                     "previous": {"lr": 0.1}, "applied_at_step": 120,
                     "source": "policy:plateau", "reason": "loss <flat>"})
    assert ev is not None
    assert change_label("lr", 0.01, ev) == ("<b>lr</b> 0.1 &rarr; 0.01<br>step 120, by "
                                            "policy:plateau<br><i>loss &lt;flat&gt;</i>")
    assert change_label("lr", 0.5, Applied(3, "cli", {"lr": 0.5}, {}, None)) == \
        "<b>lr</b> 0.5<br>step 3, by cli"
