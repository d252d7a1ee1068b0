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


def read_records(path: Path, since: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        with open(path, "rb") as f:
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
    if rank is None:
        return [run_dir.supervisor_log]
    return [p for name in ("stdout.log", "stderr.log")
            for p in sorted(run_dir.logs_dir.glob(f"torchrun/**/attempt_*/{rank}/{name}"))]
