"""Where the dashboard's figures go: laid out for the questions a person asks of a run.

Runs in: the notebook kernel (``LivePlots.pump``, on its event loop). Is it still
learning? The loss comes first, across the whole width and taller than the rest. Is it
learning well? Accuracy and the script's own metrics next. What is in force, and did my
change help? The hyper-parameters as step lines, each change marked on them and on the
loss. Is a rank slow, could the batch grow? The system last: throughput, per-rank times
with the straggler ratio, the gradient noise scale next to the batch size. Two figures a
row: a notebook cell is wide, and a single column pushes half of them out of sight. A
hyper-parameter or system series that never changed would be a flat line taking a
figure's room: it is a line of text until it changes.
"""

from __future__ import annotations

import html
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

LOSS, LEARNED, HPARAMS, SYSTEM = range(4)
# The system figures, in this order: a straggler and a noisy throughput explain each other.
SYSTEM_TITLES = ("throughput (samples/s)", "step and data time per rank (s)",
                 "step time (s)", "gradient noise scale", "gradient norm")
COLUMNS = 2
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


def grid(figures: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Children of a Bokeh ``GridBox``: the loss (first, when there is one) over the
    whole width, the others COLUMNS a row."""
    out: list[tuple[Any, ...]] = []
    row = col = 0
    for i, fig in enumerate(figures):
        if i == 0 and getattr(fig, "name", None) == "loss":
            out.append((fig, 0, 0, 1, COLUMNS))
            row = 1
            continue
        out.append((fig, row, col))
        col += 1
        if col == COLUMNS:
            row, col = row + 1, 0
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
