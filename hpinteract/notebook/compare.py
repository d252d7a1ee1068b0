"""``hpi.compare([job1, job2], metric="loss")``: one metric of several jobs, overlaid, live.

Runs in: the notebook kernel. Each job's history comes from its run directory, then its
live stream, exactly as in a dashboard; all lines share one figure (and its smoothing and
log controls), named by job id or by the ``labels`` given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as w

from ..client.bulk import columns, load_history
from .live import Feed, Ticker, show
from .paced import PacedBokeh
from .plots import HPARAM_METRICS, LivePlots

INTERVAL_S = 0.25


class Comparison:
    """Lines of ``metric``, one per job; displayed like a dashboard, live until all end."""

    def __init__(self, jobs: Sequence[Any], metric: str = "loss",
                 labels: Sequence[str] | None = None, smoothing: float = 0.0,
                 log: bool = False, budget: int = 2000) -> None:
        if not jobs:
            raise ValueError("compare needs at least one job")
        names = list(labels) if labels is not None else [j.id for j in jobs]
        if len(names) != len(jobs) or len(set(names)) != len(names):
            raise ValueError(f"labels must name each job once, got {names!r} for "
                             f"{len(jobs)} jobs")
        self.metric = metric
        self.labels = dict(zip((j.id for j in jobs), names, strict=True))
        # One figure, the metric's: step lines where it is a hyper-parameter.
        self.plots = LivePlots(names, budget=budget, smoothing=smoothing, log=log,
                               group=lambda _name: metric,
                               hparams=names[:1] if metric in HPARAM_METRICS else ())
        self.feeds: list[tuple[str, Feed]] = []
        for job, label in zip(jobs, names, strict=True):
            hist = load_history(job.run_dir)
            if metric in hist.columns:
                xs, ys = hist.columns[metric]
                self.plots.add_points(label, xs, ys)
            self.feeds.append((label, Feed(job, since=hist.last_seq)))
        self.plots.pump()
        self.smoothing, self.log = self.plots.controls()
        self.message = w.HTML()
        self.bokeh = PacedBokeh(self.plots.layout, layout=w.Layout(width="100%"))
        self.widget = w.VBox([w.HBox([self.smoothing, self.log, self.message]), self.bokeh])
        self.ticker = Ticker(self._tick, INTERVAL_S, self._failed)
        self.ticker.start()

    def _tick(self) -> bool:
        for label, feed in self.feeds:
            metrics = [r for r in feed.take() if "kind" not in r]
            got = columns(metrics, {self.metric}).get(self.metric)
            if got is not None:
                self.plots.add_points(label, *got)
            if feed.error:
                self._failed(f"{label}: {feed.error}")
        drawn = self.bokeh.draw(self.plots.pump)
        return not (drawn and all(feed.done for _, feed in self.feeds))

    def _failed(self, text: str) -> None:
        self.message.value = f"<pre style='color:#dc3545'>{text}</pre>"

    def point_counts(self) -> dict[str, int]:
        return self.plots.point_counts()

    @property
    def live(self) -> bool:
        return self.ticker.running

    def close(self) -> None:
        self.ticker.stop()
        for _, feed in self.feeds:
            feed.close()

    def _ipython_display_(self) -> None:
        show(self.widget)


def compare(jobs: Sequence[Any], metric: str = "loss", **options: Any) -> Comparison:
    """Overlay ``metric`` of several jobs (Job objects or ids) in one live figure."""
    from ..client import attach

    resolved = [attach(j) if isinstance(j, str) else j for j in jobs]
    return Comparison(resolved, metric, **options)
