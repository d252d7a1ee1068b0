"""Reading a job's logs: metrics and events as DataFrames, records after a given seq.

Runs in: client processes. The logs in the run directory are the source of truth, so a
client that was not running when something happened still sees it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..protocol.rundir import RunDir

if TYPE_CHECKING:
    import pandas as pd


BISECT_FROM = 1 << 20  # bytes: below this a log is scanned from its start


def _seq_of(line: bytes) -> int | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return int(rec["seq"]) if isinstance(rec, dict) and "seq" in rec else None


def _first_after(f: Any, size: int, since: int) -> int:
    """A byte offset at or before the first line with seq > ``since``. The log's seqs
    increase down the file (one writer), so a bisection over offsets finds it in ~20
    reads: a client catching up on the tail of a million-step log does not decode it."""
    lo, hi = 0, size
    while hi - lo > 1 << 14:
        mid = (lo + hi) // 2
        f.seek(mid)
        f.readline()  # to the start of the next whole line
        start = f.tell()
        seq = _seq_of(f.readline())
        if seq is not None and seq <= since:
            lo = start
        else:
            hi = mid
    return lo


def read_records(path: Path, since: int = 0) -> list[dict[str, Any]]:
    """The records of a log with seq > ``since``, in file order."""
    out: list[dict[str, Any]] = []
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(_first_after(f, size, since) if since and size > BISECT_FROM else 0)
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line being written, or torn by a crash
                if isinstance(rec, dict) and rec.get("seq", 0) > since:
                    out.append(rec)
    except FileNotFoundError:
        pass
    return out


def metrics_frame(run_dir: RunDir, evals: bool = False) -> pd.DataFrame:
    """Training records (one row per step), or with ``evals`` those of ``run.log_eval``."""
    import pandas as pd  # here, not at import time: each CLI command starts 0.5 s sooner

    records = [r for r in read_records(run_dir.metrics_log) if bool(r.get("eval")) == evals]
    if evals:
        for r in records:
            r.pop("eval", None)
    if not records:
        return pd.DataFrame(columns=["step", "epoch", "time", "loss"])
    df = pd.DataFrame.from_records(records)
    first = [c for c in ("step", "epoch", "time", "loss") if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]].reset_index(drop=True)


def events_frame(run_dir: RunDir) -> pd.DataFrame:
    import pandas as pd

    records = read_records(run_dir.events_log)
    cols = ["seq", "time", "kind", "source", "status", "values", "applied_at_step", "state"]
    if not records:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame.from_records(records)
    return df[[c for c in cols if c in df.columns] + [c for c in df.columns if c not in cols]]


def local_page(run_dir: RunDir, since: int) -> tuple[list[dict[str, Any]], bool]:
    """Every record after ``since`` from both logs, merged by seq (one page, nothing more)."""
    recs = read_records(run_dir.metrics_log, since) + read_records(run_dir.events_log, since)
    recs.sort(key=lambda r: int(r["seq"]))
    return recs, False


def rank_applies(run_dir: RunDir) -> dict[int, list[dict[str, Any]]]:
    """What each rank applied, at which step: {rank: [{"id", "op", "step", "values"}]}."""
    out: dict[int, list[dict[str, Any]]] = {}
    for p in sorted((run_dir.path / "ranks").glob("*.jsonl")):
        rows = []
        for line in p.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        out[int(p.stem)] = rows
    return out


def log_paths(run_dir: RunDir, rank: int | None) -> list[Path]:
    """The supervisor's combined log (rank None), or torchrun's per-rank stdout and stderr
    of every attempt."""
    if rank is None:  # on several nodes sharing the directory, each node's supervisor's
        return [run_dir.supervisor_log, *sorted(run_dir.logs_dir.glob("supervisor-*.log"))]
    return [p for name in ("stdout.log", "stderr.log")
            for p in sorted(run_dir.logs_dir.glob(f"torchrun/**/attempt_*/{rank}/{name}"))]
