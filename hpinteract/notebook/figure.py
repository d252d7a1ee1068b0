"""One figure of the live plots: a kind of metric, its lines and its change markers.

Runs in: the notebook kernel, on its event loop (through ``LivePlots``). A line is drawn
smoothed with its raw values faint behind it; a hyper-parameter as a step line (the value
held until the next change). The change markers carry HTML labels (built escaped by the
dashboard) shown on hover.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure

from . import layout


class Figure:
    """One metric kind: a figure, its lines and its change markers."""

    def __init__(self, title: str, x_range: Any, log: bool, steps: bool = False) -> None:
        self.title, self.x_range = title, x_range
        self.steps = steps  # a hyper-parameter: a value held until the next change
        self.lines: dict[str, tuple[ColumnDataSource, str]] = {}
        self.changes = ColumnDataSource({"x": [], "y": [], "label": []})
        self.fig = self._draw(log, lambda name: 0.0)

    def _draw(self, log: bool, smoothing_of: Callable[[str], float]) -> Any:
        big = self.title == "loss"
        kw: dict[str, Any] = {"height": layout.LOSS_HEIGHT if big else layout.HEIGHT,
                              "sizing_mode": "stretch_width", "min_width": 300,
                              "name": self.title, "title": self.title,
                              "x_axis_label": "step",
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
        f.add_tools(HoverTool(renderers=[marks], tooltips="@label{safe}"))
        self.raw: dict[str, Any] = {}  # the unsmoothed lines, shown faintly when smoothed
        self.hover = HoverTool(renderers=[], mode="vline", tooltips=[
            ("line", "$name"), ("step", "@x{0,0}"), ("value", "@y{0.0000g}"),
            ("raw", "@raw{0.0000g}")])
        f.add_tools(self.hover)
        for name, (src, color) in self.lines.items():
            self._glyphs(f, name, src, color, smoothing_of(name))
        return f

    def _glyphs(self, f: Any, name: str, src: ColumnDataSource, color: str,
                smoothing: float) -> None:
        if self.steps:
            # Bokeh's step glyph draws the held values but has no hover: an invisible
            # line over the same points answers it.
            f.step("x", "raw", source=src, color=color, line_width=2, mode="after",
                   legend_label=name)
            line = f.line("x", "raw", source=src, alpha=0, name=name)
        else:
            self.raw[name] = f.line("x", "raw", source=src, color=color, alpha=0.25,
                                    visible=smoothing > 0)
            line = f.line("x", "y", source=src, color=color, line_width=1.8,
                          legend_label=name, name=name)
        self.hover.renderers = [*self.hover.renderers, line]
        f.legend.location, f.legend.click_policy = "top_left", "hide"

    def add_line(self, name: str, color: str, smoothing: float) -> ColumnDataSource:
        src = ColumnDataSource({"x": np.empty(0), "y": np.empty(0), "raw": np.empty(0)})
        self.lines[name] = (src, color)
        self._glyphs(self.fig, name, src, color, smoothing)
        return src

    def redraw(self, log: bool, smoothing_of: Callable[[str], float]) -> Any:
        """A new figure with the other y scale over the same sources (Bokeh cannot change
        a drawn figure's scale, bokeh/bokeh#11983)."""
        self.fig = self._draw(log, smoothing_of)
        return self.fig
