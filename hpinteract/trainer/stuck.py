"""The fork of the coordinator process: kept safe, and what a child that does not start is
doing, for the warning that says so.

Runs in: rank 0's training thread, around the fork of its coordinator (control_process.py).
One start in several hundred has hung before the child armed its own traceback timer
(docs/ARCHITECTURE.md): so the child inherits, from the fork itself, a faulthandler handler
that writes every thread's Python stack to the rank's log on ``DUMP_SIGNAL`` (it runs in C,
so a child stuck anywhere still answers it), and rank 0 reads the child's kernel state
(``/proc``: running, or asleep and where) before it gives up on it. And no garbage
collection runs in the child before it has frozen what it inherited (a finalizer of rank
0's objects there could wait forever on a lock or thread that exists only in rank 0).
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
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


@contextlib.contextmanager
def no_collection_across_fork() -> Iterator[None]:
    """Around ``os.fork()``: no garbage collection from just before the fork until the
    child has frozen what it inherited (forked.serve calls ``gc.freeze()``, then enables
    it). A collection in the child before that could run the finalizers of rank 0's
    objects (a process group, a store, a tensor), some of which wait on locks or threads
    that exist only in rank 0: one candidate for the start hang. rank 0 gets its
    collector back at once."""
    pid = os.getpid()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if os.getpid() == pid and enabled:
            gc.enable()


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
