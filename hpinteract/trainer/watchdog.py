"""Hangs: a rank that completes no step for ``hang_timeout`` seconds ends the job, with
every rank's stack and the frame each one is stuck in.

Runs in: a daemon thread of every rank; the training thread only stores the time of its
last step (``beat``, one attribute a step). A collective that never completes blocks the
main thread in C with the interpreter lock released, so this thread still runs. When it
finds no step for ``hang_timeout`` (a live hyper-parameter; 0 turns it off) while the job
is neither paused nor between steps on purpose (``Run.between_steps``: a checkpoint, an
evaluation, a loader starting), it

1. writes every thread's stack (faulthandler) to the rank's stderr, which torchrun keeps
   in the job's logs, and to ``logs/hang/``;
2. records the rank's failure: ``hang`` where the main thread is in the script's own code
   (the rank that did not reach the step), ``waiting`` where it waits in a collective for
   the others, each with its frame (protocol/failures.py names the hung ranks);
3. waits for the other ranks to write theirs, then ends the process with HANG_EXIT; rank 0
   first closes its coordinator, so the logs are complete and the state is ``failing``
   (or ``starting`` when torchrun will restart from the newest checkpoint).

Like NCCL's watchdog, it ends the job rather than wait forever: a hang has no remedy inside
the process. A rank stuck in C code that holds the interpreter lock stops this thread too;
torchrun's and the scheduler's own timeouts are the backstop there.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .restart import attempt

if TYPE_CHECKING:
    from .run import Run

HANG_EXIT = 124  # as timeout(1)
# Where a main thread waiting for the other ranks is: the collectives, DDP's reducer (its
# all-reduce ends inside backward) and hpinteract's own control sync.
_COLLECTIVE = (f"{os.sep}torch{os.sep}distributed{os.sep}",
               f"{os.sep}torch{os.sep}nn{os.sep}parallel{os.sep}",
               f"{os.sep}torch{os.sep}autograd{os.sep}",
               f"{os.sep}hpinteract{os.sep}trainer{os.sep}sync.py")
_OURS = (f"{os.sep}torch{os.sep}", f"{os.sep}hpinteract{os.sep}", f"{os.sep}lightning{os.sep}",
         f"{os.sep}pytorch_lightning{os.sep}", f"{os.sep}transformers{os.sep}",
         f"{os.sep}accelerate{os.sep}")


def frame_of(frame: Any) -> dict[str, Any]:
    """Where a thread is: its innermost frame, the innermost frame of the script's own code,
    and whether it waits in a collective."""
    stack = traceback.extract_stack(frame)
    inner = stack[-1]
    own = next((f for f in reversed(stack) if not any(p in f.filename for p in _OURS)), inner)
    return {"file": own.filename, "line": own.lineno, "function": own.name,
            "code": (own.line or "").strip(), "innermost": f"{inner.filename}:{inner.lineno} "
                                                          f"in {inner.name}",
            "waiting": any(p in inner.filename for p in _COLLECTIVE)}


class Watchdog:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.beat: float | None = None  # perf_counter of the last step (None: none yet)
        self.outside = 0  # between_steps depth: work that is not a step, on purpose
        self.fired = False
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpinteract-watchdog",
                                        daemon=True)
        self._thread.start()

    def timeout(self) -> float:
        try:
            return float(self.run.hp.get("hang_timeout", 0) or 0)
        except (TypeError, ValueError):
            return 0.0

    def enter(self) -> None:
        """Work that is not a step begins (for hooks that bracket it: Lightning's
        validation); ``leave`` ends it."""
        self.outside += 1

    def leave(self) -> None:
        self.outside = max(0, self.outside - 1)
        if self.beat is not None:
            self.beat = time.perf_counter()  # the time until the next step starts now

    @contextlib.contextmanager
    def between_steps(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def stop(self) -> None:
        self._stop.set()

    def _check_every(self) -> float:
        timeout = self.timeout()
        return 1.0 if timeout <= 0 else min(5.0, max(0.25, timeout / 4))

    def _watch(self) -> None:
        while not self._stop.wait(self._check_every()):
            timeout, beat = self.timeout(), self.beat
            if timeout <= 0 or beat is None:
                continue
            if self.outside or self.run.paused:
                self.beat = time.perf_counter()  # a pause or a checkpoint is no hang
                continue
            quiet = time.perf_counter() - beat
            if quiet > timeout:
                self._fire(quiet, timeout)
                return

    def _fire(self, quiet: float, timeout: float) -> None:
        self.fired = True
        run = self.run
        where = self._dump(run)
        frame = sys._current_frames().get(self._main or 0)
        found = frame_of(frame) if frame is not None else {"waiting": False, "file": "?",
                                                           "line": 0, "function": "?",
                                                           "code": "", "innermost": "?"}
        kind = "waiting" if found["waiting"] else "hang"
        doing = ("waited in a collective for the other ranks" if found["waiting"] else
                 "did not reach the end of the step")
        message = (f"no step completed for {quiet:.0f}s (hang_timeout={timeout:g}); this rank "
                   f"{doing}, at {found['file']}:{found['line']} in {found['function']}"
                   + (f": {found['code']}" if found["code"] else ""))
        run._end.failed("Hang", message, f"stacks in {where}", kind=kind,
                        extra={"frame": found})
        # Every rank fires within one check of the others (the same last step): waiting as
        # long again lets each write its record before any process ends.
        time.sleep(self._check_every() + 1.0)
        sys.stderr.flush()
        os._exit(HANG_EXIT)

    def _dump(self, run: Run) -> str:
        """Every thread's stack, to stderr (the job's logs) and to logs/hang/."""
        folder = run.run_dir.logs_dir / "hang"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / f"attempt-{attempt()}-rank-{run.rank}.txt"
        print(f"hpinteract: rank {run.rank} completed no step for hang_timeout="
              f"{self.timeout():g}s; every thread's stack follows (also in {path})",
              file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        with open(path, "w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        return str(path)
