"""How a run ends: ``run.finish()``, a script that exits without it, an exception, SIGTERM.

Runs in: every rank's training thread (and the interpreter's exit handlers on it). Each
way records the job's end once: rank 0 closes its coordinator, which flushes the logs and
writes the end state, the rank's own log is closed, and only a clean finish joins the
other ranks' last rendezvous (anything else may be on this rank alone, and a collective
would wait forever for ranks still training). An uncaught exception is recorded in the
rank's failure record (with its traceback) and, on rank 0, as a state that is not terminal
(``failing``, or ``starting`` when torchrun has restarts left): the terminal failure and
its root cause are the supervisor's to record.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import traceback
from typing import TYPE_CHECKING, Any

from ..protocol.failures import is_peer_loss, write_rank_failure
from ..protocol.states import JobState
from .distributed import leave_together
from .restart import attempt, restarts_left
from .sigterm import SigtermGuard

if TYPE_CHECKING:
    from .run import Run


_active: Ending | None = None  # this process's run, until it ends (exited_with)


def exited_with(code: object) -> None:
    """The script raised ``SystemExit`` with a failing code (the bootstrap saw it): recorded
    as this rank's failure, not as the clean end the exit handler would take it for."""
    if _active is not None and not _active.done:
        _active.ending = True
        _active.failed("SystemExit", f"exited with code {code}", "", kind="exit")


class Ending:
    def __init__(self, run: Run) -> None:
        global _active
        _active = self
        self.run = run
        self.done = False
        self.raised = False  # the excepthook ran
        self.ending = False  # an end is being written: a SIGTERM waits for it
        self._prev_hook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)
        self._sigterm = SigtermGuard(lambda: self.ending)

    def finish(self, state: JobState, error: dict[str, Any] | None, together: bool,
               deliver: bool = True) -> None:
        if self.done:
            return
        self.done = self.ending = True
        atexit.unregister(self._at_exit)
        sys.excepthook = self._prev_hook
        r = self.run
        r._watch.stop()
        if r._coord is not None:
            r._post_status()
            r._coord.close(state, error)
        r._rank_log.close()
        self._sigterm.restore(deliver=deliver)
        if state == JobState.FINISHED and together:
            leave_together(r._group, r.topology)

    def _at_exit(self) -> None:
        # The script ended without finish(): maybe on this rank only (sys.exit), so no
        # collective here; a rank still training elsewhere would wait on it forever. After
        # an exception whose recording itself failed, never a clean end.
        self.finish(JobState.FAILING if self.raised else JobState.FINISHED, None,
                    together=False)

    def _excepthook(self, etype: Any, value: Any, tb: Any) -> None:
        self.ending = self.raised = True
        self.failed(etype.__name__, str(value),
                    "".join(traceback.format_exception(etype, value, tb)))
        self._prev_hook(etype, value, tb)
        self._sigterm.restore(deliver=True)  # after the traceback: it ends the process

    def failed(self, etype: str, message: str, trace: str, kind: str | None = None,
               extra: dict[str, Any] | None = None) -> None:
        """This rank is ending by an exception (or an exit code): its own record of why, and
        on rank 0 a state that is not terminal.

        A rank cannot tell its own failure from a consequence of another's (a peer killed
        by a signal shows here as a broken connection), so no rank writes a terminal
        failure: the supervisor, which sees torchrun's exit codes and signals, does
        (supervisor.py); without one (plain torchrun), clients conclude it from the rank
        records once rank 0's process is gone (protocol/failures.py)."""
        if self.done:  # the first account stands (a hang's, before the broken collective)
            return
        r = self.run
        with contextlib.suppress(OSError):  # the logs are still closed properly below
            write_rank_failure(r.run_dir, attempt(), r.rank, r.step_index, etype, message,
                               trace, kind, extra)
        restarting = restarts_left() > 0
        if r._coord is not None:
            # Restarting: torchrun starts the workers again, which resume from the newest
            # checkpoint; the restart event names the cause.
            r._coord.post("event", {"kind": "attempt_failed", "step": r.step_index,
                                    "seen_by": r.rank, "error": message,
                                    "lost_peer": is_peer_loss(message), "attempt": attempt(),
                                    "restarts_left": restarts_left(), "source": "job"})
        state = JobState.STARTING if restarting else JobState.FAILING
        self.finish(state, None, together=False, deliver=False)
