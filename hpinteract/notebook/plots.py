"""Live Bokeh plots of a job's metrics: one figure per kind of metric, lines streamed into
their data sources, a marker at every hyper-parameter change.

Runs in: the notebook kernel, on its event loop only (``LivePlots.pump`` is called by the
dashboard's update task; Bokeh models must not be touched from another thread). The
figures live in one Bokeh layout shown through jupyter_bokeh's ``BokehModel`` widget, so
new points reach the browser as ``ColumnDataSource.stream`` patches over the widget's
comm: never a redrawn cell, never ``push_notebook``.

Bokeh cannot switch a drawn figure's scale (bokeh/bokeh#11983), so the log toggle draws
new figures over the same data sources and x range. Where each figure goes: ``layout``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import ipywidgets as w
import numpy as np
from bokeh.events import RangesUpdate, Reset
from bokeh.layouts import column
from bokeh.models import ColumnDataSource
from bokeh.palettes import Category10_10

from ..protocol.errors import ConfigError
from . import layout
from .figure import Figure
from .series import Series, SeriesView

# Which figure a metric goes to, and how its name is matched: "is" the name itself, "in"
# any name holding it (val_loss, train_acc), "rank" it followed by a rank (step_time_r1),
# "family" it or it followed by "_" (goodput_best, goodput_workers_4); the first rule that
# matches wins. A metric no rule claims gets a figure of its own.
GROUPS: tuple[tuple[str, str, str], ...] = (
    ("loss", "loss", "in"), ("accuracy", "acc", "in"), ("learning rate", "lr", "is"),
    ("batch size", "batch_size", "is"), ("throughput (samples/s)", "samples_per_s", "is"),
    ("gradient noise scale", "gns", "is"), ("gradient norm", "grad_norm", "is"),
    ("step and data time per rank (s)", "step_time_r", "rank"),
    ("step and data time per rank (s)", "data_time_r", "rank"),
    ("step time (s)", "step_time", "is"), ("step time (s)", "data_time", "is"),
    ("statistical efficiency", "goodput_efficiency", "is"),
    ("goodput (samples/s x efficiency)", "goodput", "family"),
)
MATCH: dict[str, Callable[[str, str], bool]] = {
    "is": lambda name, key: name == key,
    "in": lambda name, key: key in name,
    "rank": lambda name, key: name.startswith(key) and name[len(key):].isdigit(),
    "family": lambda name, key: name == key or name.startswith(key + "_"),
}
# Not drawn unless asked for by name: bookkeeping, the noise scale's parts, the goodput
# policy's fitted costs (in its decisions' reasons). (The straggler ratio is in the
# per-rank figure's title.)
HIDDEN = frozenset({"epoch", "time", "progress", "gns_grad_sq", "gns_var", "straggler",
                    "eval", "goodput_step_fixed_s", "goodput_sample_s"})
# Hyper-parameters the job logs with its metrics: drawn as step lines.
HPARAM_METRICS = ("lr", "batch_size")
# Smoothed from the start, whatever the smoothing slider says: one step's samples/s is noise.
SMOOTHED = {"samples_per_s": 0.9}


def group_of(name: str) -> str:
    """The figure a metric belongs to: ``val_loss`` joins ``loss``, ``train_acc`` joins
    ``accuracy``, ``step_time_r1`` joins the step times."""
    return next((title for title, key, how in GROUPS if MATCH[how](name, key)), name)


class LivePlots:
    """Figures for metrics (of one job; ``hpi.compare`` names its lines by job and puts them
    in one figure through ``group``), fed by ``add_points`` and drawn by ``pump``."""

    def __init__(self, metrics: Iterable[str] | None = None, budget: int = 2000,
                 smoothing: float = 0.0, log: bool = False,
                 group: Callable[[str], str] = group_of,
                 hparams: Iterable[str] = HPARAM_METRICS,
                 columns: int = layout.COLUMNS) -> None:
        if isinstance(columns, bool) or not isinstance(columns, int) or \
                not 1 <= columns <= layout.MAX_COLUMNS:
            raise ConfigError(f"columns={columns!r}: figures a row, an integer from 1 to "
                              f"{layout.MAX_COLUMNS}")
        self.columns = columns
        self.only = set(metrics) if metrics is not None else None
        self.group = group
        # Figures of hyper-parameters: step lines, in the layout's hyper-parameter section.
        self.hparam_titles = {group(n) for n in hparams}
        self.budget, self.smoothing, self.log = budget, smoothing, log
        self.series: dict[str, Series] = {}
        self.views: dict[str, SeriesView] = {}
        self.figures: dict[str, Figure] = {}
        self._sources: dict[str, ColumnDataSource] = {}
        self._pending_changes: list[tuple[float, str, str]] = []
        self._redraw: set[str] = set()  # lines whose points were taken away (rewind)
        self._zoom: tuple[float | None, float | None] | None = None
        self._varying: set[str] = set()  # series whose value has changed at least once
        self._shown: list[str] = []  # the figures in the grid, in order
        self._arranged_for: tuple[int, int] | None = None  # (lines, varying) then
        self._straggler: float | None = None
        # What never changed, as HTML: shown by the dashboard as a widget above the plots
        # (a Bokeh Div would need BokehJS's widgets bundle in the page too).
        self.unchanged = ""
        self.layout = column(sizing_mode="stretch_width")
        self._x_range: Any = None

    # ---- data in (any order; cheap) -----------------------------------------------------
    def wants(self, name: str) -> bool:
        if self.only is not None:
            return name in self.only
        return name not in HIDDEN

    def add_points(self, name: str, xs: Any, ys: Any) -> None:
        if name == "straggler" and len(ys):
            self._straggler = float(np.asarray(ys, dtype=np.float64)[-1])
        if not self.wants(name):
            return
        s = self.series.get(name)
        if s is None:
            s = self.series[name] = Series(name)
            self.views[name] = SeriesView(s, self.budget, self._smoothing_of(name))
        s.extend(xs, ys)
        if name not in self._varying and s.n and layout.varies(s.y[0], ys):
            self._varying.add(name)

    def _smoothing_of(self, name: str) -> float:
        return max(self.smoothing, SMOOTHED.get(name, 0.0))

    def rewind(self, step: float) -> None:
        """The job went back to ``step`` (resume, restart): later points are redrawn away."""
        for name, s in self.series.items():
            if s.keep_before(step):
                self._redraw.add(name)

    def add_change(self, step: float, label: str, name: str) -> None:
        """A marker at ``step`` in the figure of the hyper-parameter ``name`` (if drawn)
        and in the loss figure."""
        self._pending_changes.append((step, label, name))

    # ---- drawing (the event loop only) ---------------------------------------------------
    def pump(self) -> int:
        """Move what arrived since the last call into the figures; the points sent."""
        sent = 0
        if self._zoom is not None:
            start, end = self._zoom
            self._zoom = None
            for view in self.views.values():
                if (view.start, view.end) != (start, end) and view.series.name in \
                        self._sources:
                    view.start, view.end = start, end
                    self._sources[view.series.name].data = view.full()
        for name in self.views:
            if name not in self._sources:
                self._new_line(name)
        if self._arranged_for != (len(self._sources), len(self._varying)):
            self._arrange()
        self._title_straggler()
        for name in self._redraw & set(self._sources):
            self._sources[name].data = self.views[name].full()
        self._redraw.clear()
        for name, view in self.views.items():
            src = self._sources[name]
            upd = view.update()
            if upd is None:
                continue
            how, data = upd
            sent += len(data["x"])
            if how == "stream":
                src.stream(dict(data), rollover=2 * self.budget)  # a bound; update() keeps under
            else:
                src.data = data
        self._draw_changes()
        return sent

    def _new_line(self, name: str) -> ColumnDataSource:
        title = self.group(name)
        fig = self.figures.get(title)
        if fig is None:
            fig = self.figures[title] = Figure(title, self._x_range, self.log,
                                                steps=title in self.hparam_titles)
            self._x_range = self._x_range or fig.fig.x_range
            self._listen(fig.fig)
        color = Category10_10[len(fig.lines) % 10]
        src = self._sources[name] = fig.add_line(name, color, self._smoothing_of(name))
        return src

    def _arrange(self) -> None:
        """The figures in the layout's order; one that only holds series that never
        changed (a hyper-parameter or system figure) is a line of text instead. Called
        when a line came or a series first changed; the grid is sent again only when
        what it shows changed."""
        self._arranged_for = (len(self._sources), len(self._varying))
        titles = layout.ordered(list(self.figures), self.hparam_titles)
        shown, still = [], {}
        for t in titles:
            fig = self.figures[t]
            if layout.section(t, self.hparam_titles) in (layout.LOSS, layout.LEARNED) or \
                    any(n in self._varying for n in fig.lines):
                shown.append(t)
            else:
                still.update({n: float(self.series[n].y[0]) for n in fig.lines
                              if self.series[n].n})
        if shown != self._shown:  # one change of the layout, however many figures
            self._shown = shown
            self.layout.children = layout.rows([self.figures[t].fig for t in shown],
                                               self.columns)
        self.unchanged = layout.unchanged_text(still)

    def _title_straggler(self) -> None:
        per_rank = self.figures.get("step and data time per rank (s)")
        if per_rank is not None and self._straggler is not None:
            title = f"{per_rank.title} · straggler ratio {self._straggler:.2f}"
            if per_rank.fig.title.text != title:
                per_rank.fig.title.text = title

    def _draw_changes(self) -> None:
        if not self._pending_changes:
            return
        pending, self._pending_changes = self._pending_changes, []
        per_fig: dict[str, dict[str, list[Any]]] = {}
        for step, label, name in pending:
            for target in {self.group(name), "loss"}:
                fig = self.figures.get(target)
                if fig is None:
                    continue
                y = self._value_at(target, step)
                d = per_fig.setdefault(target, {"x": [], "y": [], "label": []})
                d["x"].append(step)
                d["y"].append(y)
                d["label"].append(label)
        for target, d in per_fig.items():
            self.figures[target].changes.stream(dict(d))

    def _value_at(self, title: str, step: float) -> float:
        """The y of the figure's first line at ``step`` (where the change marker sits)."""
        for name in self.figures[title].lines:
            s = self.series[name]
            if s.n:
                i = int(np.clip(np.searchsorted(s.x, step), 0, s.n - 1))
                v = float(s.y[i])
                if np.isfinite(v):
                    return v
        return float("nan")

    # ---- controls --------------------------------------------------------------------------
    def set_smoothing(self, alpha: float) -> None:
        self.smoothing = alpha
        for name, view in self.views.items():
            view.smoothing = self._smoothing_of(name)
            if name in self._sources:
                self._sources[name].data = view.full()
        for fig in self.figures.values():
            for name, r in fig.raw.items():
                r.visible = self._smoothing_of(name) > 0

    def set_log(self, log: bool) -> None:
        if log == self.log:
            return
        self.log = log
        for fig in self.figures.values():
            self._listen(fig.redraw(log, self._smoothing_of))
        self._shown = []  # new figures: the grid is built again
        self._arrange()
        self._title_straggler()

    def _listen(self, f: Any) -> None:
        f.on_event(RangesUpdate, self._on_ranges)
        f.on_event(Reset, self._on_reset)

    def _on_ranges(self, event: Any) -> None:
        # A user's pan or zoom. A view whose right edge reaches the newest point follows
        # the tail; any other is refined: decimated afresh within the window.
        last = max((float(s.x[-1]) for s in self.series.values() if s.n), default=0.0)
        x0, x1 = event.x0, event.x1
        if x0 is None or x1 is None:
            return
        self._zoom = (None, None) if x1 >= last else (float(x0), float(x1))

    def _on_reset(self, event: Any) -> None:
        self._zoom = (None, None)

    def point_counts(self) -> dict[str, int]:
        """Points each line holds in its data source now (what the browser draws)."""
        return {n: len(src.data["x"]) for n, src in self._sources.items()}

    def controls(self) -> Any:
        """The smoothing slider and log-y toggle above the figures, bound to them."""
        smoothing = w.FloatSlider(value=self.smoothing, min=0.0, max=0.99, step=0.01,
                                  description="smoothing", continuous_update=False,
                                  readout_format=".2f")
        smoothing.observe(lambda c: self.set_smoothing(float(c["new"])), "value")
        log = w.ToggleButton(value=self.log, description="log y", icon="line-chart",
                             tooltip="logarithmic y axes")
        log.observe(lambda c: self.set_log(bool(c["new"])), "value")
        return smoothing, log
