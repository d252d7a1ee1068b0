"""Live Bokeh plots of a job's metrics: one figure per kind of metric, lines streamed into
their data sources, a marker at every hyper-parameter change.

Runs in: the notebook kernel, on its event loop only (``LivePlots.pump`` is called by the
dashboard's update task; Bokeh models must not be touched from another thread). The
figures live in one Bokeh layout shown through jupyter_bokeh's ``BokehModel`` widget, so
new points reach the browser as ``ColumnDataSource.stream`` patches over the widget's
comm: never a redrawn cell, never ``push_notebook``.

Bokeh cannot switch a drawn figure's scale (bokeh/bokeh#11983), so the log toggle draws
new figures over the same data sources and x range.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import ipywidgets as w
import numpy as np
from bokeh.events import RangesUpdate, Reset
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from .series import Series, SeriesView

# Which figure a metric goes to; a metric no rule claims gets a figure of its own.
GROUPS: tuple[tuple[str, str], ...] = (
    ("loss", "loss"), ("accuracy", "acc"), ("learning rate", "lr"),
    ("batch size", "batch_size"), ("throughput (samples/s)", "samples_per_s"),
    ("gradient noise scale", "gns"), ("gradient norm", "grad_norm"),
    ("step time per rank (s)", "step_time_r"), ("step time (s)", "step_time"),
    ("step time (s)", "data_time"),
)
# Not drawn unless asked for by name: bookkeeping, or the noise scale's parts.
HIDDEN = frozenset({"epoch", "time", "progress", "gns_grad_sq", "gns_var", "straggler",
                    "eval"})
HIDDEN_PREFIXES = ("data_time_r",)  # per-rank data waits: asked for by name


def group_of(name: str) -> str:
    """The figure a metric belongs to: ``val_loss`` joins ``loss``, ``train_acc`` joins
    ``accuracy``, ``step_time_r1`` joins the step times."""
    for title, key in GROUPS:
        if name == key or (key in ("loss", "acc") and key in name) or \
                (key.endswith("_r") and name.startswith(key)):
            return title
    return name


class _Figure:
    """One metric kind: a figure, its lines and its change markers."""

    def __init__(self, title: str, x_range: Any, log: bool) -> None:
        self.title, self.x_range = title, x_range
        self.lines: dict[str, tuple[ColumnDataSource, str]] = {}
        self.changes = ColumnDataSource({"x": [], "y": [], "label": []})
        self.fig = self._draw(log, smoothing=0.0)

    def _draw(self, log: bool, smoothing: float) -> Any:
        kw: dict[str, Any] = {"height": 210, "sizing_mode": "stretch_width",
                              "title": self.title, "x_axis_label": "step",
                              "tools": "pan,box_zoom,xwheel_zoom,reset,save",
                              "active_scroll": "xwheel_zoom"}
        if self.x_range is not None:
            kw["x_range"] = self.x_range
        f = figure(**kw, y_axis_type="log" if log else "linear")
        f.toolbar.logo = None
        f.vspan(x="x", source=self.changes, line_color="#888888", line_dash="dashed",
                line_alpha=0.6)
        marks = f.scatter(x="x", y="y", source=self.changes, marker="inverted_triangle",
                          size=9, color="#555555")
        f.add_tools(HoverTool(renderers=[marks], tooltips=[("change", "@label")]))
        self.raw: list[Any] = []
        self.main: list[Any] = []
        self.hover = HoverTool(renderers=[], mode="vline", tooltips=[
            ("line", "$name"), ("step", "@x{0,0}"), ("value", "@y{0.0000g}"),
            ("raw", "@raw{0.0000g}")])
        f.add_tools(self.hover)
        for name, (src, color) in self.lines.items():
            self._glyphs(f, name, src, color, smoothing)
        return f

    def _glyphs(self, f: Any, name: str, src: ColumnDataSource, color: str,
                smoothing: float) -> None:
        self.raw.append(f.line("x", "raw", source=src, color=color, alpha=0.25,
                               visible=smoothing > 0))
        line = f.line("x", "y", source=src, color=color, line_width=1.8, legend_label=name,
                      name=name)
        self.main.append(line)
        self.hover.renderers = [*self.hover.renderers, line]
        f.legend.location, f.legend.click_policy = "top_left", "hide"

    def add_line(self, name: str, color: str, smoothing: float) -> ColumnDataSource:
        src = ColumnDataSource({"x": np.empty(0), "y": np.empty(0), "raw": np.empty(0)})
        self.lines[name] = (src, color)
        self._glyphs(self.fig, name, src, color, smoothing)
        return src

    def redraw(self, log: bool, smoothing: float) -> Any:
        """A new figure with the other y scale over the same sources (Bokeh cannot change
        a drawn figure's scale, bokeh/bokeh#11983)."""
        self.fig = self._draw(log, smoothing)
        return self.fig


class LivePlots:
    """Figures for metrics (of one job; ``hpi.compare`` names its lines by job and puts them
    in one figure through ``group``), fed by ``add_points`` and drawn by ``pump``."""

    def __init__(self, metrics: Iterable[str] | None = None, budget: int = 2000,
                 smoothing: float = 0.0, log: bool = False,
                 group: Callable[[str], str] = group_of) -> None:
        self.only = set(metrics) if metrics is not None else None
        self.group = group
        self.budget, self.smoothing, self.log = budget, smoothing, log
        self.series: dict[str, Series] = {}
        self.views: dict[str, SeriesView] = {}
        self.figures: dict[str, _Figure] = {}
        self._sources: dict[str, ColumnDataSource] = {}
        self._pending_changes: list[tuple[float, str, str]] = []
        self._redraw: set[str] = set()  # lines whose points were taken away (rewind)
        self._zoom: tuple[float | None, float | None] | None = None
        self.layout = column(sizing_mode="stretch_width")
        self._x_range: Any = None

    # ---- data in (any order; cheap) -----------------------------------------------------
    def wants(self, name: str) -> bool:
        if self.only is not None:
            return name in self.only
        return name not in HIDDEN and not name.startswith(HIDDEN_PREFIXES)

    def add_points(self, name: str, xs: Any, ys: Any) -> None:
        if not self.wants(name):
            return
        s = self.series.get(name)
        if s is None:
            s = self.series[name] = Series(name)
            self.views[name] = SeriesView(s, self.budget, self.smoothing)
        s.extend(xs, ys)

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
        before = len(self.figures)
        for name in self.views:
            if name not in self._sources:
                self._new_line(name)
        if len(self.figures) != before:  # one change of the layout, however many figures
            self.layout.children = [f.fig for f in self.figures.values()]
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
            fig = self.figures[title] = _Figure(title, self._x_range, self.log)
            self._x_range = self._x_range or fig.fig.x_range
            self._listen(fig.fig)
        color = Category10_10[len(fig.lines) % 10]
        src = self._sources[name] = fig.add_line(name, color, self.smoothing)
        return src

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
            view.smoothing = alpha
            if name in self._sources:
                self._sources[name].data = view.full()
        for fig in self.figures.values():
            for r in fig.raw:
                r.visible = alpha > 0

    def set_log(self, log: bool) -> None:
        if log == self.log:
            return
        self.log = log
        for fig in self.figures.values():
            self._listen(fig.redraw(log, self.smoothing))
        self.layout.children = [f.fig for f in self.figures.values()]

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
