"""Where the dashboard's figures go: laid out for the questions a person asks of a run.

Runs in: the notebook kernel (``LivePlots.pump``, on its event loop). Is it still
learning? The loss comes first, across the whole width and taller than the rest. Is it
learning well? Accuracy and the script's own metrics next. What is in force, and did my
change help? The hyper-parameters as step lines, each change marked on them and on the
loss. Is a rank slow, could the batch grow? The system last: throughput, per-rank times
with the straggler ratio, the gradient noise scale next to the batch size. Two figures a
row by default (``job.dashboard(columns=1)`` for a narrow cell, 3 for a wide screen): a
notebook cell is wide, and a single column pushes half of them out of sight. A
hyper-parameter or system series that never changed would be a flat line taking a
figure's room: it is a line of text until it changes.
"""

from __future__ import annotations

import html
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.models import Row, Spacer

LOSS, LEARNED, HPARAMS, SYSTEM = range(4)
# The system figures, in this order: a straggler and a noisy throughput explain each other.
SYSTEM_TITLES = ("throughput (samples/s)", "step and data time per rank (s)",
                 "step time (s)", "gradient noise scale", "goodput (samples/s x efficiency)",
                 "statistical efficiency", "gradient norm")
COLUMNS, MAX_COLUMNS = 2, 4
LOSS_HEIGHT, HEIGHT = 300, 220


def section(title: str, hparam_titles: Collection[str]) -> int:
    if title == "loss":
        return LOSS
    if title in hparam_titles:
        return HPARAMS
    if title in SYSTEM_TITLES:
        return SYSTEM
    return LEARNED


def ordered(titles: Sequence[str], hparam_titles: Collection[str]) -> list[str]:
    """``titles`` (in the order their first point came) by section; the batch size right
    before the noise scale, which suggests one."""
    def key(t: str) -> tuple[int, int, int]:
        s = section(t, hparam_titles)
        within = SYSTEM_TITLES.index(t) if s == SYSTEM else titles.index(t)
        if t == "batch size" and s == HPARAMS:
            within = len(titles)  # the last hyper-parameter: next to the system's start
        return s, within, titles.index(t)
    return sorted(titles, key=key)


def rows(figures: Sequence[Any], columns: int = COLUMNS) -> list[Any]:
    """The plots column's children: the loss (first, when there is one) alone across the
    width, then the others ``columns`` to a Bokeh ``Row`` (a last one short of figures keeps
    its share: a Spacer fills the rest). Rows of a column, not a ``GridBox``: BokehJS's
    grid lays its model's children out even while the views of children just added are
    being built, and fails (a page error, seen in Notebook 7); a flex row lays out the
    views it has."""
    rest = list(figures)
    out: list[Any] = [rest.pop(0)] if rest and getattr(rest[0], "name", None) == "loss" \
        else []
    for i in range(0, len(rest), columns):
        group = rest[i : i + columns]
        group += [Spacer(sizing_mode="stretch_width") for _ in range(columns - len(group))]
        out.append(Row(children=group, sizing_mode="stretch_width"))
    return out


def varies(first: float, ys: Any) -> bool:
    """Whether any of ``ys`` (an array) differs from ``first``; NaN is a value like any
    other (a series of NaN never changed)."""
    ys = np.asarray(ys, dtype=np.float64)
    return bool(np.any((ys != first) & ~(np.isnan(ys) & np.isnan(first))))


def unchanged_text(values: Mapping[str, float]) -> str:
    """The series that never changed, as one line of HTML."""
    if not values:
        return ""
    items = " · ".join(f"<b>{html.escape(n)}</b> {v:.6g}" for n, v in sorted(values.items()))
    return f"<span style='color:#555'>unchanged so far: {items}</span>"
