"""The Bokeh widget of the live plots, paced by the browser: one patch per update, and the
next only once the browser has applied the last.

Runs in: the notebook kernel, on its event loop (the dashboard's and ``compare``'s update
task call ``draw``; the browser's acknowledgement arrives as a comm message on the same
thread).

Why: jupyter_bokeh's ``BokehModel`` sends every change of the document as a patch of its
own (three comm messages, plus two per array), as fast as the kernel makes them. A browser
that applies and draws them slower than the job streams (a busy laptop; headless Chromium
on two cores) falls behind without bound, and every other widget message of the notebook
queues behind the plots: the lr control's "since step N (widget)" showed a minute after the
change was applied. Here the changes of one update travel as one ``PATCH-DOC``, whose last
event sets a counter that a ``CustomJS`` in the page copies back to the kernel once the
patch is applied; the next update waits for that echo. The points that arrive meanwhile
stay in the kernel's series and go with the next patch (decimated like any other), so a
slow browser sees fewer, larger updates and never a backlog. With no page showing the
plots (a notebook run by nbclient, a closed tab) no echo comes: after ``stale_s`` the next
update goes anyway, so the kernel-side models stay current at a slow pace.

This overrides ``BokehModel._document_patched`` (jupyter_bokeh 4.x), which builds the same
messages one event at a time; the message format is Bokeh's ``PATCH-DOC``, unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from bokeh.document.events import DocumentPatchedEvent
from bokeh.models import CustomJS, LayoutDOM
from bokeh.protocol import Protocol
from jupyter_bokeh.widgets import BokehModel

STALE_S = 2.0  # with no echo for this long, the next update goes anyway (no page, or lost)

# Runs in the page, inside the patch it was sent with: the counter's new value is copied to
# the model the kernel listens to. jupyter_bokeh sends changes made while it applies a
# patch once the patch is done, so the echo means "everything before it is applied".
_ECHO = "echo.tags = cb_obj.tags.slice()"


class PacedBokeh(BokehModel):  # type: ignore[misc]  # jupyter_bokeh is untyped
    """A ``BokehModel`` whose document changes are held and sent by ``draw``."""

    def __init__(self, model: LayoutDOM, stale_s: float = STALE_S, **kwargs: Any) -> None:
        self._held: list[DocumentPatchedEvent] = []
        self.stale_s = stale_s
        self.sent = 0  # patches sent
        self.acked = 0  # the newest patch the page says it has applied
        self._sent_at = float("-inf")
        # Two models with no view of their own: the counter the kernel sets, the echo the
        # page sets. Held in the model's tags so that they belong to its document.
        self._counter = CustomJS(code="")
        self._echo = CustomJS(code="")
        self._counter.js_on_change("tags", CustomJS(args={"echo": self._echo}, code=_ECHO))
        self._echo.on_change("tags", self._on_echo)
        model.tags = [*model.tags, self._counter, self._echo]
        super().__init__(model, **kwargs)

    # ---- the page's side --------------------------------------------------------------------
    def _on_echo(self, _attr: str, _old: Any, new: Any) -> None:
        if new and isinstance(new[0], int):
            self.acked = max(self.acked, new[0])

    @property
    def ready(self) -> bool:
        """Whether the page has applied the last patch (or has been silent for
        ``stale_s``): the next may go."""
        return self.acked >= self.sent or time.monotonic() - self._sent_at > self.stale_s

    # ---- the kernel's side ------------------------------------------------------------------
    def _document_patched(self, event: DocumentPatchedEvent) -> None:
        if event.setter is self:  # came from the page: it has it already
            return
        self._held.append(event)

    def draw(self, update: Callable[[], object]) -> bool:
        """Call ``update`` (which changes the document: new points, markers) and send what
        it and anything since the last patch changed, as one patch, if the page is ready
        for it; whether it was."""
        if not self.ready:
            return False
        update()
        if self._held:
            self.sent += 1
            self._counter.tags = [self.sent]  # last: echoed once all before it is applied
            events, self._held = self._held, []
            self._send_patch(events)
            self._sent_at = time.monotonic()
        return True

    def _send_patch(self, events: list[DocumentPatchedEvent]) -> None:
        # The same messages jupyter_bokeh sends for one event (its page side reassembles
        # them with Bokeh's protocol Receiver), for all of them at once.
        msg = Protocol().create("PATCH-DOC", events)
        for part in (msg.header_json, msg.metadata_json, msg.content_json):
            self.send({"msg": "patch", "payload": part})
        for buffer in msg.buffers:
            self.send({"msg": "patch", "payload": json.dumps(buffer.ref)})
            self.send({"msg": "patch"}, [buffer.to_bytes()])
