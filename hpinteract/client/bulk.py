"""A job's whole history, read from its run directory as columns, fast enough for a
1,000,000-step run to open in about a second.

Runs in: client processes (the notebook kernel, the Jupyter server extension). Jobs keep
a columnar copy of their metrics (protocol.columns): reading it is a few array reads. A run
without one (older, or written by something else) is parsed from its JSON-lines log;
decoding a million of them into dicts and then into columns costs seconds in Python, so the
lines are parsed by pyarrow's multithreaded JSON reader straight into columns when pyarrow
is installed (a pandas companion most data-science environments carry). Without it, or for
a log pyarrow refuses (a diverged run writes ``NaN``, which is not JSON), one
``json.loads`` of the whole file as an array is the fallback: still one C call, not a
million.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

from ..protocol.columns import read_columns
from ..protocol.rundir import RunDir
from .decimate import Array
from .history import read_records

Columns = dict[str, tuple[Array, Array]]
_SENTINEL = -1.2345678901234567e308  # stands for a non-finite value while pyarrow parses
_SENTINEL_TEXT = repr(_SENTINEL).encode()
_NON_FINITE = re.compile(rb":\s*(?:-?Infinity|NaN)(?=\s*[,}])")


def columns(records: list[dict[str, Any]], names: set[str] | None = None,
            x: str = "step") -> dict[str, tuple[list[float], list[float]]]:
    """Per metric, its (xs, ys) from metric records; only numbers, only ``names`` if given.
    Bools and strings are not plotted; a record without ``x`` is skipped."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for rec in records:
        xv = rec.get(x)
        if not isinstance(xv, int | float):
            continue
        for k, v in rec.items():
            if k in ("seq", x) or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            if names is not None and k not in names:
                continue
            xs, ys = out.setdefault(k, ([], []))
            xs.append(float(xv))
            ys.append(float(v))
    return out


@dataclass
class History:
    columns: Columns = field(default_factory=dict)  # metric -> (steps, values)
    events: list[dict[str, Any]] = field(default_factory=list)
    last_seq: int = 0  # the live stream continues after this
    count: int = 0  # metric records read
    last_metric: dict[str, Any] | None = None  # the newest training record, for progress


def _complete_lines(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return b""
    end = data.rfind(b"\n")  # a line still being written is left for the live stream
    return data[: end + 1] if end >= 0 else b""


def _arrow_columns(data: bytes) -> tuple[Columns, int, int] | None:
    try:
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:
        return None
    # json.dumps writes a non-finite float as NaN / Infinity, which is not JSON: as a value
    # (after a colon, so no string is touched) it becomes a sentinel that is turned back
    # into NaN below, so a diverged step stays a gap in the line, not a bridged point.
    if b"NaN" in data or b"Infinity" in data:  # a scan is cheap; a rewrite is not
        data = _NON_FINITE.sub(b":" + _SENTINEL_TEXT, data)
    try:
        # Large blocks: the reader's threads parse one block each (4x faster than 4 MiB).
        table = pj.read_json(BytesIO(data), read_options=pj.ReadOptions(block_size=1 << 24))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # mixed types in a column, say: the fallback decodes it as it is
    names = table.column_names
    if "step" not in names or "seq" not in names:
        return {}, 0, 0
    steps = table.column("step").to_numpy(zero_copy_only=False).astype(np.float64)
    seqs = table.column("seq").to_numpy(zero_copy_only=False)
    cols: Columns = {}
    for name in names:
        if name in ("seq", "step"):
            continue
        col = table.column(name)
        if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
            continue  # strings, booleans (the eval flag), nested values: not plotted
        values = col.to_numpy(zero_copy_only=False).astype(np.float64)
        values[values == _SENTINEL] = np.nan
        keep = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        cols[name] = (steps[keep], values[keep])
    return cols, int(seqs.max()) if len(seqs) else 0, len(seqs)


def _json_columns(data: bytes) -> tuple[Columns, int, int]:
    lines = [ln for ln in data.split(b"\n") if ln.strip()]
    try:
        records = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:  # a torn line in the middle (a crash): decode line by line
        records = []
        for ln in lines:
            try:
                records.append(json.loads(ln))
            except ValueError:
                continue
    records = [r for r in records if isinstance(r, dict)]
    last = max((int(r.get("seq", 0)) for r in records), default=0)
    cols: Columns = {}
    for k, (xs, ys) in columns(records).items():  # the live path's own record-to-columns
        values = np.asarray(ys, dtype=np.float64)
        values[~np.isfinite(values)] = np.nan  # as the pyarrow path: a gap in the line
        cols[k] = (np.asarray(xs, dtype=np.float64), values)
    return cols, last, len(records)


def last_record(path: Path) -> dict[str, Any] | None:
    """The newest training record, from the log's last 64 KiB (None before the first)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - 65536))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "step" in rec and not rec.get("eval"):
            return rec
    return None


def load_history(run_dir: RunDir) -> History:
    """Every metric as (steps, values) columns, and the events up to the same point, as
    the files hold them: from the job's columnar copy (protocol.columns) when it has one,
    else parsed from the JSON-lines log. The logs are read one after the other while the
    job writes them, so events newer than the last metric read are left to the live
    stream (which continues after ``last_seq``): nothing is missed, nothing comes twice."""
    got = read_columns(run_dir.columns_dir)
    if got is not None:
        cols, last_seq, count = got
    else:
        data = _complete_lines(run_dir.metrics_log)
        parsed = _arrow_columns(data) if data else ({}, 0, 0)
        cols, last_seq, count = parsed if parsed is not None else _json_columns(data)
    events = [e for e in read_records(run_dir.events_log) if int(e.get("seq", 0)) <= last_seq]
    last = last_record(run_dir.metrics_log)
    if last is not None and int(last.get("seq", 0)) > last_seq:
        last = None  # the stream brings it
    return History(cols, events, last_seq, count, last)
