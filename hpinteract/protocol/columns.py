"""The metrics log's columnar copy: one binary file per metric, so that a client opens a
1,000,000-step history by reading arrays instead of decoding a million JSON lines.

Runs in: rank 0's coordinator (``ColumnWriter``, next to the JSON-lines log, which
stays the source of truth) and clients (``read_columns``). Layout, under the run
directory's ``columns/`` (owner-only):

    <quoted name>.f64   little-endian float64 triples (seq, step, value), appended
    seq                 "<seq> <records>": everything up to this seq is in the files

The coordinator appends the triples and then rewrites ``seq`` (atomically) once per
cycle, with the JSON log's flush: buffered writes, never an fsync. A reader takes ``seq``
first and ignores entries after it, which a flush still in progress may have written; the
live stream continues from there. A run without the directory (or with a damaged one) is
read from its JSON log instead: this copy is an index, never needed.
"""

from __future__ import annotations

import math
import os
from array import array
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, unquote

SUFFIX = ".f64"
WATERMARK = "seq"


def _file_name(metric: str) -> str:
    # Metric names come from user code: quoted, so that none can leave the directory.
    return quote(metric, safe="") + SUFFIX


class ColumnWriter:
    """Appends every numeric field of the metric records it is given."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(mode=0o700, exist_ok=True)
        self._buf: dict[str, array[float]] = {}
        self._files: dict[str, IO[bytes]] = {}
        self._seq, self._records = _watermark(directory) or (0, 0)
        self._dirty = False

    def add(self, record: dict[str, Any]) -> None:
        seq, step = record.get("seq"), record.get("step")
        if not isinstance(seq, int) or not isinstance(step, int | float):
            return
        for k, v in record.items():
            if k in ("seq", "step") or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            buf = self._buf.get(k)
            if buf is None:
                buf = self._buf[k] = array("d")
            buf.extend((seq, step, v))
        self._seq, self._records, self._dirty = seq, self._records + 1, True

    def flush(self) -> None:
        if not self._dirty:
            return
        for name, buf in self._buf.items():
            if buf:
                f = self._files.get(name)
                if f is None:
                    fd = os.open(self.dir / _file_name(name),
                                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    f = self._files[name] = os.fdopen(fd, "ab")
                buf.tofile(f)
                f.flush()
                del buf[:]
        tmp = self.dir / f".{WATERMARK}.tmp"
        tmp.write_text(f"{self._seq} {self._records}\n")
        os.replace(tmp, self.dir / WATERMARK)
        self._dirty = False

    def close(self) -> None:
        self.flush()
        for f in self._files.values():
            f.close()
        self._files.clear()


def _watermark(directory: Path) -> tuple[int, int] | None:
    try:
        seq, records = (directory / WATERMARK).read_text().split()
        return int(seq), int(records)
    except (OSError, ValueError):
        return None


def read_columns(directory: Path) -> tuple[dict[str, tuple[Any, Any]], int, int] | None:
    """({metric: (steps, values)}, seq, records) as of the watermark, or None when the
    directory is missing or damaged. Non-finite values come back as NaN (a gap)."""
    import numpy as np

    mark = _watermark(directory)
    if mark is None:
        return None
    seq, records = mark
    out: dict[str, tuple[Any, Any]] = {}
    try:
        paths = [p for p in directory.iterdir() if p.name.endswith(SUFFIX)]
        for p in paths:
            raw = np.fromfile(p, dtype="<f8")
            rows = raw[: len(raw) - len(raw) % 3].reshape(-1, 3)
            rows = rows[rows[:, 0] <= seq]  # a flush in progress: the stream's to deliver
            values = rows[:, 2].copy()
            values[~np.isfinite(values)] = math.nan
            out[unquote(p.name[: -len(SUFFIX)])] = (rows[:, 1].copy(), values)
    except (OSError, ValueError):
        return None
    return out, seq, records
