"""SIGTERM as an exception, so that a stopped rank still writes its logs.

Runs in: the main (training) thread of every rank. torchrun stops the surviving workers
with SIGTERM when one rank dies (before a restart or at the job's end), and so do
schedulers that preempt a job (Slurm's scancel, a Kubernetes eviction). Python's default
for SIGTERM ends the process at once, and rank 0's buffered metrics of the last steps
were lost with it: a restart then under-reported the steps it ran again (seen in CI).
Raising :class:`Terminated` instead lets the run's excepthook record the failure and close
the coordinator, which flushes the logs, before the process exits.

The handler only raises: it never takes a lock or writes a file itself, because it runs
wherever the main thread was interrupted (even inside a ``queue.Queue.put``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

MESSAGE = "stopped by SIGTERM (torchrun stopping the workers after a failure, or a preemption)"


class Terminated(Exception):  # named for what happened, as KeyboardInterrupt is
    """SIGTERM reached this rank while it trained.

    An ``Exception`` (not a ``BaseException``) so that torchrun's ``record`` writes it to
    the rank's error file; restart.py counts its message as a consequence, not a cause.
    """


class SigtermGuard:
    """Turns SIGTERM into :class:`Terminated` until :meth:`restore`.

    ``finishing()`` true means the run is already writing its end: the signal is then
    held back (``pending``) and delivered by :meth:`restore`, after the logs are written.
    Installed only over the default action, so a script's own handler is left alone.
    """

    def __init__(self, finishing: Callable[[], bool]) -> None:
        self._finishing = finishing
        self.pending = False
        self._installed = False
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            signal.signal(signal.SIGTERM, self._handle)
            self._installed = True

    def _handle(self, signum: int, frame: Any) -> None:
        if self._finishing():
            self.pending = True
            return
        raise Terminated(MESSAGE)

    def restore(self, *, deliver: bool) -> None:
        """Put the default action back; with ``deliver``, act on a held-back SIGTERM now."""
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._installed = False
        if deliver and self.pending:
            self.pending = False
            signal.raise_signal(signal.SIGTERM)
