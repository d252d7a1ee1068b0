"""The websocket of one job: its history for the chart first, then live metrics and events.

Runs in: the Jupyter server process. A thread per socket follows the job with the client's
``Job.stream`` (history paged in, then live, each record once) and queues what the chart
needs; a periodic callback on the server's event loop sends what was queued a few times a
second, so a fast job is a handful of messages a second, whatever its step rate. The first
message is the decimated history up to a seq; the stream continues after that seq, so
nothing is shown twice or missed.

Messages: ``{"type": "history", "metrics": {name: {"x": [...], "y": [...]}}, "events":
[...], "seq": n}``, then ``{"type": "records", "metrics": [{step, loss, lr, ...}],
"events": [...]}``, and ``{"type": "end", "state": ...}`` once the job has ended.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.ioloop import PeriodicCallback
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from ..client import Job
from ..protocol.errors import HpiError, JobNotFound
from . import service
from .handlers import AUTH_RESOURCE, dumps

SEND_EVERY_MS = 250
END = object()


class JobSocket(WebSocketMixin, WebSocketHandler, JupyterHandler):
    auth_resource = AUTH_RESOURCE

    @ws_authenticated
    async def get(self, job_id: str) -> None:
        # Before the upgrade: an unknown job, or a user the authorizer refuses, is an HTTP
        # error, not a socket that opens and closes.
        if not self.authorizer.is_authorized(self, self.current_user, "read", AUTH_RESOURCE):
            raise web.HTTPError(403)
        try:
            self.job: Job = self.settings["hpinteract_jobs"].get(job_id)
        except HpiError as exc:
            raise web.HTTPError(404 if isinstance(exc, JobNotFound) else 400,
                                exc.message) from None
        await super().get(job_id)

    def open(self, *args: Any, **kwargs: Any) -> None:
        super().open(*args, **kwargs)  # the mixin's keep-alive pings
        # ("send", message) as it is, or ("record", a job's record) to batch, or END.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._sender = PeriodicCallback(self._send, SEND_EVERY_MS)
        self._sender.start()
        threading.Thread(target=self._follow, name=f"hpi-ws-{self.job.id}", daemon=True).start()

    def _follow(self) -> None:
        try:
            first = service.chart_history(self.job.run_dir)
            self._queue.put(("send", first))
            for rec in self.job.stream(idle_s=0.25, since=int(first["seq"]), stop=self._stop):
                self._queue.put(("record", rec))
        except Exception as exc:  # the browser is told; the server carries on
            self.log.exception("hpinteract: following job %s failed", self.job.id)
            self._queue.put(("send", {"type": "error", "message": f"{type(exc).__name__}: {exc}"}))
        self._queue.put(END)

    def _send(self) -> None:
        metrics: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        out: list[Any] = []
        ended = False
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is END:
                ended = True
                continue
            what, data = item
            if what == "send":
                out.append(data)
            elif "kind" in data:
                events.append(data)
            elif (rec := service.chart_record(data)) is not None:
                metrics.append(rec)
        if metrics or events:
            out.append({"type": "records", "metrics": metrics, "events": events})
        if ended:
            out.append({"type": "end", "state": self.job.state.value})
            self._sender.stop()
        try:
            for msg in out:
                self.write_message(dumps(msg))
        except WebSocketClosedError:
            self._close()

    def on_message(self, message: str | bytes) -> None:
        pass  # the socket only sends; commands go through the REST handlers

    def on_close(self) -> None:
        self._close()

    def _close(self) -> None:
        self._stop.set()
        self._sender.stop()
