"""What ``hpinteract watch`` and ``hpinteract jobs`` draw: rich's live progress bar and
tables on a terminal, plain lines when the output is a pipe or a file.

Runs in: the user's terminal process (the ``hpinteract`` command); never imports torch.
On a terminal, rich keeps one live line at the bottom (the bar, the rate, the ETA and the
latest metrics, redrawn at most REDRAWS_PER_S times a second: light over a slow SSH link)
and prints every event above it, so the history scrolls and the bar stays. Into a pipe
(CI logs, ``| tee``) nothing is redrawn: one metric line every 1/LINES_PER_S s and every
event when it comes, after the step it came at. Rate and ETA are measured on the job's
own clock (each record's ``time``), so watching an ended job, whose history arrives at
once, shows the rate it trained at.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Column, Table
from rich.text import Text

from .protocol.changes import Applied

LINES_PER_S = 2.0  # into a pipe or a file: a readable log, not a flood
REDRAWS_PER_S = 10.0  # on a terminal: smooth, yet light over a slow ssh link
RATE_WINDOW_S = 20.0  # the rate and ETA follow the last this many seconds of the job
SHOWN = (("epoch", "epoch"), ("loss", "loss"), ("lr", "lr"), ("batch_size", "batch"),
         ("samples_per_s", "samples/s"))
STATE_STYLE = {"running": "green", "finished": "bold", "failed": "bold red",
               "paused": "yellow", "starting": "cyan", "stopping": "yellow"}


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def assignments(values: dict[str, Any]) -> str:
    # JSON, so that `hpinteract set` reads the output back: strings quoted, true/false.
    return " ".join(f"{k}={json.dumps(values[k])}" for k in sorted(values))


def progress_of(rec: dict[str, Any]) -> float | None:
    """The ``progress`` metric (0..1), or None where the job does not know its length."""
    p = rec.get("progress")
    if not isinstance(p, int | float) or isinstance(p, bool):
        return None
    return min(1.0, max(0.0, float(p)))


def metrics_text(rec: dict[str, Any]) -> str:
    return "  ".join(f"{label} {fmt(rec[key])}" for key, label in SHOWN
                     if rec.get(key) is not None)


def metric_line(rec: dict[str, Any], rate: str = "") -> str:
    """A metric record as one plain line: ``step 120  12.0%  epoch 1  loss 0.3 ...``."""
    p = progress_of(rec)
    head = [f"step {rec.get('step', '?')}"] + ([f"{p:6.1%}".strip()] if p is not None
                                               else []) + ([rate] if rate else [])
    return "  ".join(head + ([m] if (m := metrics_text(rec)) else []))


def eval_line(rec: dict[str, Any]) -> str:
    """An evaluation's results (a record marked ``eval``), as an event of its own."""
    skip = ("seq", "time", "step", "epoch", "eval", "progress")
    vals = "  ".join(f"{k} {fmt(v)}" for k, v in rec.items() if k not in skip)
    return f"* eval at step {rec.get('step', '?')}: {vals}"


def event_line(rec: dict[str, Any]) -> str:
    kind, src = rec.get("kind"), rec.get("source") or "?"
    if kind == "change":
        raw = rec.get("values")
        vals = assignments(raw) if isinstance(raw, dict) else str(raw)
        change = Applied.of(rec)
        if change is not None:
            why = f": {change.reason}" if change.reason else ""
            return f"* set {vals} at step {change.step} (from {change.source}){why}"
        return f"* set {vals} {rec.get('status')} (from {src}): {rec.get('error')}"
    if kind == "state":
        at = f" at step {rec['step']}" if rec.get("step") is not None else ""
        return f"* {rec.get('state')}{at} (from {src})"
    if kind == "checkpoint":
        what = rec.get("file") if rec.get("status") == "written" else rec.get("error")
        return f"* checkpoint {rec.get('status')} at step {rec.get('step')} (from {src}): {what}"
    rest = " ".join(f"{k}={v}" for k, v in rec.items() if k not in ("seq", "time", "kind"))
    return f"* {kind}: {rest}"


class Pace:
    """Steps a second and the time left, over the last RATE_WINDOW_S of the job's clock."""

    def __init__(self) -> None:
        self.seen: deque[tuple[float, float, float | None]] = deque()  # time, step, progress

    def add(self, rec: dict[str, Any]) -> None:
        t, step = rec.get("time"), rec.get("step")
        if isinstance(t, int | float) and isinstance(step, int | float):
            if self.seen and step < self.seen[-1][1]:
                self.seen.clear()  # the job went back (a resume, a restart)
            self.seen.append((float(t), float(step), progress_of(rec)))
            while len(self.seen) > 2 and t - self.seen[0][0] > RATE_WINDOW_S:
                self.seen.popleft()

    def rate(self) -> str:
        if len(self.seen) < 2 or self.seen[-1][0] <= self.seen[0][0]:
            return ""
        (t0, s0, _), (t1, s1, _) = self.seen[0], self.seen[-1]
        return f"{(s1 - s0) / (t1 - t0):.3g} steps/s"

    def eta(self) -> str:
        if not self.seen:
            return "ETA -:--:--"
        (t0, _, p0), (t1, _, p1) = self.seen[0], self.seen[-1]
        if p0 is None or p1 is None or p1 <= p0:
            return "ETA -:--:--"
        left = round((1.0 - p1) * (t1 - t0) / (p1 - p0))
        return f"ETA {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}"


class Lines:
    """Into a pipe or a file: a metric line at most LINES_PER_S times a second, the newest
    before each event (so an event follows the step it came at), every event whole."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.pace = out, Pace()
        self.pending: dict[str, Any] | None = None
        self.last = float("-inf")

    def metric(self, rec: dict[str, Any]) -> None:
        self.pace.add(rec)
        self.pending = rec
        if time.monotonic() - self.last >= 1.0 / LINES_PER_S:
            self.flush()

    def flush(self) -> None:
        if self.pending is not None:
            self.out.write(metric_line(self.pending, self.pace.rate()) + "\n")
            self.pending, self.last = None, time.monotonic()
        self.out.flush()

    def message(self, text: str) -> None:
        self.flush()
        self.out.write(text + "\n")
        self.out.flush()

    def close(self) -> None:
        self.flush()


class Live:
    """On a terminal: rich's progress bar (its width follows the terminal's), percentage,
    rate, ETA and the latest metrics in one live line; events printed above it."""

    def __init__(self, console: Console, title: str) -> None:
        self.pace = Pace()
        one_line = Column(no_wrap=True, overflow="ellipsis")
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=None),
            TaskProgressColumn(), TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[eta]}"),
            TextColumn("{task.fields[metrics]}", markup=False, table_column=one_line),
            console=console, refresh_per_second=REDRAWS_PER_S, expand=True,
            redirect_stdout=False, redirect_stderr=False)
        # total None: rich pulses the bar until the job says how far it is
        self.task = self.progress.add_task(title, total=None, rate="", eta="", metrics="")
        self.progress.start()

    def metric(self, rec: dict[str, Any]) -> None:
        self.pace.add(rec)
        p = progress_of(rec)
        self.progress.update(
            self.task, total=None if p is None else 1.0, completed=p or 0.0,
            description=f"step {rec.get('step', '?')}", rate=self.pace.rate(),
            eta="" if p is None else self.pace.eta(), metrics=metrics_text(rec))

    def message(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        self.progress.stop()  # leaves the last bar drawn, and the cursor below it


def display(out: TextIO, title: str = "") -> Lines | Live:
    """Rich's live line where ``out`` is a terminal, else plain lines."""
    console = Console(file=out)
    return Live(console, title) if console.is_terminal else Lines(out)


def table(rows: Sequence[Sequence[Any]]) -> str:
    """Plain columns, for a pipe: the same text however wide the screen."""
    cells = [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)


def print_table(rows: Sequence[Sequence[Any]], out: TextIO, state_col: int | None = None
                ) -> None:
    """``rows[0]`` the header: a rich table on a terminal (states coloured), else plain."""
    console = Console(file=out)
    if not console.is_terminal:
        out.write(table(rows) + "\n")
        return
    t = Table(*map(str, rows[0]), box=None, header_style="bold", pad_edge=False)
    for r in rows[1:]:
        # Text, not markup: a script's name may hold "[...]"
        cells = [Text("-" if c is None else str(c)) for c in r]
        if state_col is not None:
            cells[state_col].stylize(STATE_STYLE.get(cells[state_col].plain, "none"))
        t.add_row(*cells)
    console.print(t)
