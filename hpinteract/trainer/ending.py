"""How a run ends: ``run.finish()``, a script that exits without it, an exception, SIGTERM.

Runs in: every rank's training thread (and the interpreter's exit handlers on it). Each
way records the job's end once: rank 0 closes its coordinator, which flushes the logs and
writes the end state, the rank's own log is closed, and only a clean finish joins the
other ranks' last rendezvous (anything else may be on this rank alone, and a collective
would wait forever for ranks still training). An uncaught exception is recorded as the
job's failure with its traceback, or, when torchrun has restarts left, as a failed
attempt: not a terminal state that would end the clients' waits.
"""

from __future__ import annotations

import atexit
import sys
import traceback
from typing import TYPE_CHECKING, Any

from ..protocol.states import JobState
from .distributed import leave_together
from .restart import attempt, restarts_left
from .sigterm import SigtermGuard

if TYPE_CHECKING:
    from .run import Run


class Ending:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.done = False
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
        if r._coord is not None:
            r._post_status()
            r._coord.close(state, error)
        r._rank_log.close()
        self._sigterm.restore(deliver=deliver)
        if state == JobState.FINISHED and together:
            leave_together(r._group, r.topology)

    def _at_exit(self) -> None:
        # The script ended without finish(): maybe on this rank only (sys.exit), so no
        # collective here; a rank still training elsewhere would wait on it forever.
        self.finish(JobState.FINISHED, None, together=False)

    def _excepthook(self, etype: Any, value: Any, tb: Any) -> None:
        self.ending = True
        r = self.run
        error = {"rank": r.rank, "type": etype.__name__, "message": str(value),
                 "traceback": "".join(traceback.format_exception(etype, value, tb))}
        state = JobState.FAILED
        if restarts_left() > 0 and r._coord is not None:
            # torchrun restarts the workers, which resume from the newest checkpoint: not
            # the job's end, so not a terminal state that would end clients' waits.
            state = JobState.STARTING
            r._coord.post("event", {"kind": "attempt_failed", "step": r.step_index,
                                    "error": error["message"], "attempt": attempt(),
                                    "restarts_left": restarts_left(), "source": "job"})
        self.finish(state, error, together=False, deliver=False)
        self._prev_hook(etype, value, tb)
        self._sigterm.restore(deliver=True)  # after the traceback: it ends the process
