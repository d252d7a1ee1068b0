"""The plots' widget paced by the page: one update is one Bokeh PATCH-DOC (read back here
with Bokeh's own protocol Receiver, as the page reads it), the next waits for the page's
echo of the last, and with no page at all it goes on at a slow pace. The echo's round trip
through a real page is exercised by tests/notebook/test_browser.py (the slider's
acknowledgement shows while the job streams)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from bokeh.protocol import Protocol
from bokeh.protocol.receiver import Receiver

from hpinteract.notebook import paced
from hpinteract.notebook.paced import PacedBokeh
from hpinteract.notebook.plots import LivePlots


class Page:
    """What jupyter_bokeh's page side does with the comm messages: reassemble them."""

    def __init__(self, widget: PacedBokeh) -> None:
        self.widget = widget
        self.receiver = Receiver(Protocol())
        self.patches: list[dict[str, Any]] = []
        widget.send = self._receive  # the comm, below this unit

    def _receive(self, content: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        assert content["msg"] == "patch"
        part = content["payload"] if buffers is None else buffers[0]
        msg = asyncio.run(self.receiver.consume(part))
        if msg is not None:
            assert msg.msgtype == "PATCH-DOC"
            self.patches.append(msg.content)

    def echo(self, n: int) -> None:
        """The page's CustomJS copying the counter back, as jupyter_bokeh forwards it."""
        self.widget._sync_model(self.widget, {
            "event": "jsevent", "kind": "ModelChanged", "model": {"id": self.widget._echo.id},
            "attr": "tags", "new": [n]}, [])


def plots_with_page(stale_s: float = 60.0) -> tuple[LivePlots, PacedBokeh, Page]:
    plots = LivePlots()
    plots.add_points("loss", np.arange(10.0), np.ones(10))
    plots.pump()
    widget = PacedBokeh(plots.layout, stale_s=stale_s)
    return plots, widget, Page(widget)


def test_one_update_is_one_patch_whose_last_event_is_the_counter():
    plots, widget, page = plots_with_page()
    plots.add_points("loss", np.arange(10.0, 15.0), np.zeros(5))
    # a new figure (a hyper-parameter that never changed would be text, not a figure)
    plots.add_points("lr", np.arange(10.0, 15.0), np.array([0.1, 0.1, 0.1, 0.05, 0.05]))
    assert widget.draw(plots.pump)
    [patch] = page.patches
    kinds = [e["kind"] for e in patch["events"]]
    # The new figure and line, then each line's five new points, then the counter.
    assert kinds == ["ModelChanged", "ColumnsStreamed", "ColumnsStreamed", "ModelChanged"]
    assert kinds[-1] == "ModelChanged" and patch["events"][-1]["attr"] == "tags"
    assert patch["events"][-1]["new"] == [1]
    assert patch["events"][-1]["model"]["id"] == widget._counter.id
    assert (widget.sent, widget.acked, widget.ready) == (1, 0, False)


def test_the_next_update_waits_for_the_pages_echo_and_brings_what_came_meanwhile():
    plots, widget, page = plots_with_page()
    plots.add_points("loss", np.arange(10.0, 12.0), np.zeros(2))
    assert widget.draw(plots.pump)
    for step in range(12, 20):  # the job streams on while the page is busy
        plots.add_points("loss", np.array([float(step)]), np.zeros(1))
        assert not widget.draw(plots.pump)
    assert len(page.patches) == 1 and plots.point_counts() == {"loss": 12}
    page.echo(1)
    assert widget.ready and widget.draw(plots.pump)
    assert len(page.patches) == 2 and plots.point_counts() == {"loss": 20}
    [streamed] = [e for e in page.patches[1]["events"] if e["kind"] == "ColumnsStreamed"]
    x = dict(streamed["data"]["entries"])["x"]
    assert x["shape"] == [8]  # the eight steps, in one patch


def test_an_update_with_nothing_new_sends_nothing():
    plots, widget, page = plots_with_page()
    assert widget.draw(plots.pump)
    assert page.patches == [] and widget.sent == 0 and widget.ready


def test_with_no_page_the_updates_go_on_at_the_stale_pace(monkeypatch: pytest.MonkeyPatch):
    now = [1000.0]
    monkeypatch.setattr(paced.time, "monotonic", lambda: now[0])
    plots, widget, page = plots_with_page(stale_s=2.0)
    plots.add_points("loss", np.array([10.0]), np.zeros(1))
    assert widget.draw(plots.pump)
    now[0] += 1.9
    assert not widget.ready
    now[0] += 0.2  # no echo for longer than stale_s: nobody is drawing, go on
    plots.add_points("loss", np.array([11.0]), np.zeros(1))
    assert widget.draw(plots.pump) and len(page.patches) == 2


def test_an_old_or_malformed_echo_does_not_open_the_gate():
    plots, widget, page = plots_with_page()
    for step in (10.0, 11.0):
        plots.add_points("loss", np.array([step]), np.zeros(1))
        page.echo(widget.sent)
        assert widget.draw(plots.pump)
    assert widget.sent == 2
    page.echo(1)  # a second view of the same plots, behind
    assert not widget.ready
    widget._on_echo("tags", [], ["2"])  # not a counter
    assert widget.acked == 1 and not widget.ready
