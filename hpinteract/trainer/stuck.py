"""What a coordinator process that does not start is doing, for the warning that says so.

Runs in: rank 0's training thread, around the fork of its coordinator (control_process.py).
One start in several hundred has hung before the child armed its own traceback timer
(docs/ARCHITECTURE.md): so the child inherits, from the fork itself, a faulthandler handler
that writes every thread's Python stack to the rank's log on ``DUMP_SIGNAL`` (it runs in C,
so a child stuck anywhere still answers it), and rank 0 reads the child's kernel state
(``/proc``: running, or asleep and where) before it gives up on it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

DUMP_SIGNAL = signal.SIGUSR2
DUMP_WAIT_S = 0.5  # for the child to write its stacks before it is killed


@contextlib.contextmanager
def dumpable_child() -> Iterator[None]:
    """Around ``os.fork()``: the child keeps the handler; rank 0 gets its own back at once
    (the script's handler for DUMP_SIGNAL, if it had one)."""
    pid = os.getpid()
    faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
    try:
        yield
    finally:
        if os.getpid() == pid:  # the child never comes back here: it leaves by os._exit
            faulthandler.unregister(DUMP_SIGNAL)


def describe(pid: int) -> str:
    """Ask the child for its Python stacks (into the rank's log) and say what the kernel
    says of each of its threads: 'R' running, 'S' asleep in <where>, and so on."""
    with contextlib.suppress(OSError):
        os.kill(pid, DUMP_SIGNAL)
        time.sleep(DUMP_WAIT_S)
    threads = []
    with contextlib.suppress(OSError):
        for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
            stat = (task / "stat").read_text()
            state = stat[stat.rindex(")") + 2]
            where = ""
            with contextlib.suppress(OSError):
                where = (task / "wchan").read_text().strip()
            threads.append(f"{task.name} {state}{' in ' + where if where not in ('', '0') else ''}")
    return "; ".join(threads) or "no /proc entry"
