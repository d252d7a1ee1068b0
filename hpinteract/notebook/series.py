"""A job's metric history as growable numpy columns, and the view a plot draws of it.

Runs in: the notebook kernel. ``Series`` holds every point of one metric (step, value);
``SeriesView`` turns it into what one Bokeh line shows: smoothed, min/max-decimated to a
bounded number of points, with new points appended as they arrive until the tail grows
past its share, when the whole view is decimated afresh (so the first point and every
spike stay, and the browser never holds more than ``budget`` points per line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..client.decimate import Array, EmaState, ema, minmax, window


class Series:
    """One metric's points in arrival order (a rollback makes steps repeat: kept as such;
    a resume or restart takes the steps it runs again away first)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._x = np.empty(1024)
        self._y = np.empty(1024)
        self.n = 0

    @property
    def x(self) -> Array:
        return self._x[: self.n]

    @property
    def y(self) -> Array:
        return self._y[: self.n]

    def extend(self, xs: Any, ys: Any) -> None:
        xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
        if self.n == 0 and len(xs) > len(self._x):  # a history: adopted, not copied
            self._x, self._y, self.n = xs, ys, len(xs)
            return
        need = self.n + len(xs)
        if need > len(self._x):
            cap = max(need, 2 * len(self._x))
            self._x = np.resize(self._x, cap)
            self._y = np.resize(self._y, cap)
        self._x[self.n : need] = xs
        self._y[self.n : need] = ys
        self.n = need

    def keep_before(self, step: float) -> bool:
        """Drop the points at or after ``step`` (a resumed or restarted job runs them
        again, and its log set them aside); whether any went."""
        keep = self.x < step
        n = int(keep.sum())
        if n == self.n:
            return False
        xs, ys = self.x[keep], self.y[keep]
        self._x, self._y = np.resize(xs, max(1024, 2 * n)), np.resize(ys, max(1024, 2 * n))
        self.n = n
        return True


@dataclass
class SeriesView:
    """What one line draws of a Series: ``budget`` points at most."""

    series: Series
    budget: int = 2000
    smoothing: float = 0.0
    # The window shown (None: everything, following the tail).
    start: float | None = None
    end: float | None = None
    shown: int = 0  # points of the series the current view covers
    tail: int = 0  # points appended raw since the last full decimation
    _smooth: Array = field(default_factory=lambda: np.empty(0))
    _state: EmaState = field(default_factory=EmaState)

    @property
    def following(self) -> bool:
        return self.end is None

    def full(self) -> dict[str, Array]:
        """The whole view afresh: smoothed, then decimated (within the window, if zoomed)."""
        s = self.series
        self._smooth, self._state = ema(s.y, self.smoothing)
        if self.following and self.start is None:
            idx = np.arange(s.n)
        else:
            idx = window(s.x, self.start, self.end)
            # Keep the first and last points too: a reset zoom then sees the full extent.
            if s.n:
                idx = np.unique(np.concatenate([[0], idx, [s.n - 1]]))
        # The raw values choose the points (spikes survive smoothing), both are drawn.
        keep = idx[minmax(s.y[idx], max(1, self.budget // 4))] if idx.size else idx
        self.shown, self.tail = s.n, 0
        return self._data(keep)

    def update(self) -> tuple[str, dict[str, Array]] | None:
        """What changed since the last call: ("stream", new points) when they fit the
        budget's tail share, ("replace", the whole view) when it is time to decimate
        again, or None (nothing new, or a zoomed view, which new points do not enter)."""
        s = self.series
        new = s.n - self.shown
        if new <= 0 or not self.following:
            return None
        if self.tail + new > self.budget // 2:
            return "replace", self.full()
        smooth, self._state = ema(s.y[self.shown :], self.smoothing, self._state)
        self._smooth = np.concatenate([self._smooth, smooth])
        idx = np.arange(self.shown, s.n)
        self.shown, self.tail = s.n, self.tail + new
        return "stream", self._data(idx)

    def _data(self, idx: Any) -> dict[str, Array]:
        s = self.series
        # numpy arrays: Bokeh sends them as binary buffers; NaN becomes a gap in the line.
        return {"x": s.x[idx], "y": self._smooth[idx], "raw": s.y[idx]}
