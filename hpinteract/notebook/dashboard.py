"""``job.dashboard()`` and ``job.plot()``: the control panel and live plots of one job.

Runs in: the notebook kernel. Opening reads the job's whole history from its run
directory in bulk (columnar, see ``bulk``), then follows the live stream from where the
files ended; a ``Ticker`` on the kernel's event loop moves new records into the plots and
widgets four times a second. Reopening after a kernel restart
(``hpi.attach("latest").dashboard()``) therefore shows everything, from the job's files.
"""

from __future__ import annotations

import asyncio
import html
import time
from typing import Any

import ipywidgets as w

from ..client.bulk import columns, load_history
from ..protocol.changes import Applied
from ..protocol.errors import HpiTimeout
from .live import Feed, Ticker, Worker, show
from .paced import PacedBokeh
from .panel import ControlPanel
from .plots import HPARAM_METRICS, LivePlots

INTERVAL_S = 0.25  # how often the display catches up: a few times a second, batched


class Dashboard:
    """Live plots (and, with ``controls``, the control panel) of one job. Display it as
    the last expression of a cell; it keeps updating until the job ends or ``close()``."""

    def __init__(self, job: Any, metrics: list[str] | None = None, controls: bool = True,
                 smoothing: float = 0.0, log: bool = False, budget: int = 2000,
                 columns: int = 2) -> None:
        self.job = job
        status = _status(job)
        self.plots = LivePlots(metrics, budget=budget, smoothing=smoothing, log=log,
                               hparams=set(HPARAM_METRICS) | set(status.get("specs") or {}),
                               columns=columns)
        self._epochs = status.get("epochs")
        self.worker = Worker()
        self.panel: ControlPanel | None = None
        self._panel_box = w.VBox()
        # A job that is still starting has no specs yet: the panel comes when they do.
        self._want_panel = controls
        if controls and status.get("specs"):
            self._build_panel(status)
        hist = load_history(job.run_dir)
        for name, (xs, ys) in hist.columns.items():
            self.plots.add_points(name, xs, ys)
        for ev in hist.events:
            self._event(ev)
        self._step = int(max((xs[-1] for xs, _ in hist.columns.values() if len(xs)),
                             default=-1))
        if hist.last_metric is not None and self.panel is not None:
            self.panel.on_metrics(hist.last_metric, self._epochs)
        self.records = hist.count
        self.feed = Feed(job, since=hist.last_seq)
        self.smoothing, self.log = self.plots.controls()
        self.message = w.HTML()
        self.plots.pump()
        self.unchanged = w.HTML(self.plots.unchanged)
        self.bokeh = PacedBokeh(self.plots.layout, layout=w.Layout(width="100%"))
        tools = w.HBox([self.smoothing, self.log, self.message])
        parts = [self._panel_box, tools, self.unchanged, self.bokeh]
        self.widget = w.VBox(parts, layout=w.Layout(width="100%"))
        self.ticker = Ticker(self._tick, INTERVAL_S, self._failed)
        self.ticker.start()

    def _build_panel(self, status: dict[str, Any]) -> None:
        self._want_panel = False
        self._epochs = status.get("epochs")
        self.panel = ControlPanel(self.job, status, self.worker.submit)
        self._panel_box.children = [self.panel.widget]

    def _ask_status(self) -> None:
        def done(status: Any, exc: BaseException | None) -> None:
            self._asking = False
            if exc is None and status.get("specs") and self._want_panel:
                self._build_panel(status)

        self._asking = True
        self.worker.submit(self.job.status, done)

    _asking = False

    # ---- the event loop --------------------------------------------------------------------
    def _tick(self) -> bool:
        self.worker.deliver()
        if self._want_panel and not self._asking and self.job.run_dir.connection.exists():
            self._ask_status()
        batch = self.feed.take()
        metrics = [r for r in batch if "kind" not in r]
        self.records += len(metrics)
        for name, (xs, ys) in columns(metrics).items():
            self.plots.add_points(name, xs, ys)
        for ev in (r for r in batch if "kind" in r):
            self._event(ev)
        train = [r for r in metrics if not r.get("eval")]
        if train:
            self._step = max(self._step, int(train[-1].get("step", -1)))
            if self.panel is not None:
                self.panel.on_metrics(train[-1], self._epochs)
        # New points go when the page has taken the last ones (see ``paced``).
        drawn = self.bokeh.draw(self.plots.pump)
        if self.unchanged.value != self.plots.unchanged:
            self.unchanged.value = self.plots.unchanged
        if self.feed.done and drawn:
            self._ended()
            return self.worker.busy > 0  # let the last command's answer arrive
        return True

    def _event(self, ev: dict[str, Any]) -> None:
        kind, change = ev.get("kind"), Applied.of(ev)
        if change is not None:
            for name, value in change.values.items():
                self.plots.add_change(float(change.step), change_label(name, value, change),
                                      name)
            if self.panel is not None:
                self.panel.on_change(ev)
        elif kind in ("resume", "restart", "fork"):
            step = float(ev.get("step", 0))
            self.plots.rewind(step)
            lost = f", {ev['steps_lost']} steps run again" if ev.get("steps_lost") else ""
            self.plots.add_change(step, html.escape(f"{kind} from the checkpoint at step "
                                                    f"{int(step)}{lost}"), "loss")
            if kind == "restart" and self.panel is not None:
                self.panel.report(f"torchrun restarted the workers (restart "
                                  f"{ev.get('restart')}): {ev.get('error', '')}")
        elif kind == "state" and self.panel is not None:
            self.panel.set_state(str(ev.get("state")))
            if ev.get("error"):
                self.panel.report(str(ev["error"]))

    def _ended(self) -> None:
        if self.feed.error:
            self._failed(self.feed.error)
        if self.panel is None:
            return
        state = self.job.state
        self.panel.set_state(state.value)
        err = self.job.error
        if err is not None:
            self.panel.report(str(err) + (f"\n\n{err.traceback}" if err.traceback else ""))

    def _failed(self, text: str) -> None:
        self.message.value = (f"<pre style='color:#dc3545;white-space:pre-wrap'>"
                              f"{html.escape(text)}</pre>")

    # ---- the user's side -------------------------------------------------------------------
    @property
    def live(self) -> bool:
        """Whether the dashboard is still following the job."""
        return self.ticker.running

    @property
    def step(self) -> int:
        """The newest step the dashboard has shown (-1 before any)."""
        return self._step

    async def until(self, step: int, timeout: float = 300.0) -> int:
        """``await dash.until(step=200)`` in a cell: wait, with the kernel free and the
        plots updating, until the dashboard has shown ``step`` (or the job has ended);
        returns the newest step shown. For notebooks that script a session."""
        deadline = time.monotonic() + timeout
        while self._step < step and self.live:
            if time.monotonic() > deadline:
                raise HpiTimeout(f"job {self.job.id} did not reach step {step} in "
                                 f"{timeout:.0f}s (at {self._step})")
            await asyncio.sleep(INTERVAL_S / 2)
        return self._step

    def point_counts(self) -> dict[str, int]:
        """Points each plotted line holds now (bounded by ``budget``)."""
        return self.plots.point_counts()

    def close(self) -> None:
        """Stop following the job (the figures stay as they are)."""
        self.ticker.stop()
        self.feed.close()
        self.worker.close()

    def _ipython_display_(self) -> None:
        show(self.widget)


def change_label(name: str, value: Any, change: Applied) -> str:
    """A change marker's hover text (HTML, every part escaped): what changed from what to
    what, at which step, by whom, and why."""
    prev = change.previous
    was = f"{html.escape(str(prev[name]))} &rarr; " if name in prev else ""
    text = (f"<b>{html.escape(name)}</b> {was}{html.escape(str(value))}<br>"
            f"step {change.step}, by {html.escape(change.source)}")
    if change.reason:
        text += f"<br><i>{html.escape(change.reason)}</i>"
    return text


def _status(job: Any) -> dict[str, Any]:
    try:
        return dict(job.status())
    except Exception:
        return {"state": job.state.value}
