"""Series arithmetic for the plots: debiased EMA smoothing and min/max decimation.

Runs in: client processes (notebook plots, the server extension's chart); numpy only.
Both work on whole arrays at once, so a 1,000,000-step history is smoothed and cut down to
a few thousand points in milliseconds, and both can continue from a previous call's state,
so live points are processed as they come without redoing the history.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]

# Chunk length of the blocked EMA: within a chunk the recurrence is a cumulative sum
# weighted by alpha^-i, which must stay finite (alpha^-CHUNK < 1e300 for alpha >= 1e-4).
_CHUNK = 64
_MIN_ALPHA = 1e-4  # below this the smoothing is indistinguishable from none


class EmaState(NamedTuple):
    """Where a smoothing left off: the running (biased) average and how many points fed it."""

    value: float = 0.0
    n: int = 0


def ema(y: Array, alpha: float, state: EmaState | None = None) -> tuple[Array, EmaState]:
    """The debiased exponential moving average of ``y`` (TensorBoard's smoothing):
    s_t = alpha*s_{t-1} + (1-alpha)*y_t, divided by 1 - alpha^(t+1) so the first points are
    not pulled towards 0. Non-finite points (a diverged loss) are passed through unsmoothed
    and do not feed the average, so one NaN does not blank the rest of the curve.
    ``state`` continues a previous call; the returned state continues this one."""
    y = np.asarray(y, dtype=np.float64)
    state = state or EmaState()
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {alpha}")
    if alpha < _MIN_ALPHA:  # no smoothing: the values themselves (not copied; read-only)
        finite = y[np.isfinite(y)]
        return y, EmaState(float(finite[-1]) if finite.size else state.value,
                           state.n + finite.size)
    out = y.copy()
    finite = np.isfinite(y)
    v = y[finite]
    m = v.size
    if m == 0:
        return out, state
    n = -(-m // _CHUNK) * _CHUNK
    padded = np.zeros(n)
    padded[:m] = v
    blocks = padded.reshape(-1, _CHUNK)
    j = np.arange(_CHUNK, dtype=np.float64)
    up, down = alpha ** -j, alpha ** j
    # Each chunk's EMA started from 0, then the carry from the chunks before it.
    inner = np.cumsum(blocks * up, axis=1) * down * (1.0 - alpha)
    carry = np.empty(blocks.shape[0])
    s, decay = state.value, alpha ** _CHUNK
    for c in range(blocks.shape[0]):  # one step per 64 points
        carry[c] = s
        s = inner[c, -1] + decay * s
    biased = (inner + carry[:, None] * (alpha * down)[None, :]).reshape(-1)[:m]
    t = np.arange(state.n + 1, state.n + m + 1, dtype=np.float64)
    out[finite] = biased / (1.0 - alpha ** t)
    return out, EmaState(float(biased[-1]), state.n + m)


def minmax(y: Array, buckets: int) -> Index:
    """Indices of the points to draw so that ``buckets`` equal runs of ``y`` each keep their
    smallest and largest point: every spike survives, and the first and last points are
    always kept. At most 2*buckets + 2 indices, ascending; all of them if that is not
    fewer. A non-finite point counts as an extreme (a NaN loss must not vanish)."""
    n = len(y)
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    if n <= 2 * buckets + 2:
        return np.arange(n, dtype=np.int64)
    size = -(-n // buckets)
    rows = -(-n // size)
    v = np.asarray(y, dtype=np.float64)
    bad = ~np.isfinite(v)
    lo = np.full(rows * size, np.inf)
    hi = np.full(rows * size, -np.inf)
    lo[:n] = np.where(bad, -np.inf, v)  # a NaN or inf is kept as the bucket's minimum...
    hi[:n] = np.where(np.isnan(v), -np.inf, v)
    base = np.arange(rows, dtype=np.int64) * size
    picks = np.concatenate([
        base + lo.reshape(rows, size).argmin(axis=1),
        base + hi.reshape(rows, size).argmax(axis=1),
        np.array([0, n - 1], dtype=np.int64),
    ])
    return np.unique(np.minimum(picks, n - 1))  # ...np.unique also sorts


def window(x: Array, start: float | None, end: float | None) -> Index:
    """Indices of the points whose x lies in [start, end], plus one neighbour on each side
    so that lines run to the edges of a zoomed view."""
    x = np.asarray(x)
    keep = np.ones(len(x), dtype=bool)
    if start is not None:
        keep &= x >= start
    if end is not None:
        keep &= x <= end
    idx = np.flatnonzero(keep)
    if idx.size == 0:
        return idx.astype(np.int64)
    lo, hi = max(int(idx[0]) - 1, 0), min(int(idx[-1]) + 1, len(x) - 1)
    return np.unique(np.concatenate([[lo], idx, [hi]])).astype(np.int64)
