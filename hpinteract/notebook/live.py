"""The plumbing between a job and the kernel's event loop: a reader thread, a worker thread
and the periodic task that is the only code touching widgets and Bokeh models.

Runs in: the notebook kernel. ipykernel 7 forbids displaying or updating widgets from a
background thread, and a blocking call on the event loop would freeze the kernel. So:
``Feed`` reads the job's records on a thread into a queue (ZeroMQ and files only);
``Worker`` runs the job's blocking commands on another; ``Ticker`` is an asyncio task
on the kernel's loop that drains both a few times a second and updates the display. The
kernel stays free between ticks: other cells run while the plots update.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

Done = Callable[[Any, BaseException | None], None]


def show(widget: Any) -> None:
    """Display a widget holding Bokeh figures: BokehJS first (jupyter_bokeh's view needs it
    in the page), inline by default so that it works with no internet (set
    BOKEH_RESOURCES=cdn for a smaller notebook file); its loader skips a page that has it."""
    from bokeh.io import output_notebook
    from bokeh.resources import Resources
    from bokeh.settings import settings
    from IPython.display import display

    mode = settings.resources(default="inline")
    output_notebook(Resources(mode=mode, components=["bokeh"]), hide_banner=True)
    display(widget)  # type: ignore[no-untyped-call]  # IPython.display is untyped


class Feed:
    """Every record of a job after ``since``, read on a thread, taken in batches."""

    def __init__(self, job: Any, since: int) -> None:
        self.job = job
        self._q: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self.ended = False
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(since,), daemon=True,
                                        name=f"hpi-feed-{job.id}")
        self._thread.start()

    def _run(self, since: int) -> None:
        try:
            for rec in self.job.stream(idle_s=0.2, since=since, stop=self._stop):
                self._q.put(rec)
        except Exception:
            self.error = traceback.format_exc()
        finally:
            self.ended = True

    def take(self, limit: int = 200_000) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        with contextlib.suppress(queue.Empty):
            while len(out) < limit:
                out.append(self._q.get_nowait())
        return out

    @property
    def done(self) -> bool:
        """The stream has ended and everything it read has been taken."""
        return self.ended and self._q.empty()

    def close(self) -> None:
        self._stop.set()


class Worker:
    """Runs blocking calls (commands to the job) off the event loop, one at a time, and
    hands their results back to be called on it."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpi-command")
        self._results: queue.SimpleQueue[tuple[Done, Any, BaseException | None]] = \
            queue.SimpleQueue()
        self.busy = 0

    def submit(self, call: Callable[[], Any], done: Done) -> None:
        self.busy += 1

        def run() -> None:
            try:
                result, exc = call(), None
            except BaseException as e:
                result, exc = None, e
            self._results.put((done, result, exc))

        self._pool.submit(run)

    def deliver(self) -> int:
        """Call the callbacks of finished calls (on the caller's thread: the event loop)."""
        n = 0
        with contextlib.suppress(queue.Empty):
            while True:
                done, result, exc = self._results.get_nowait()
                self.busy -= 1
                n += 1
                done(result, exc)
        return n

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Ticker:
    """Calls ``tick`` every ``interval`` seconds on the running event loop until it returns
    False or ``stop`` is called. A tick that raises stops the ticker and is reported by
    ``on_error`` (the display shows it; the kernel is unaffected)."""

    def __init__(self, tick: Callable[[], bool], interval: float,
                 on_error: Callable[[str], None]) -> None:
        self.tick, self.interval, self.on_error = tick, interval, on_error
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = asyncio.get_event_loop()  # a kernel cell: the kernel's own loop
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                more = self.tick()
            except Exception:
                self.on_error(traceback.format_exc())
                return
            if not more:
                return
            await asyncio.sleep(self.interval)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
