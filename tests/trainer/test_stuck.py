"""Around the fork of the coordinator process (hpinteract/trainer/stuck.py), with real forks:
no garbage collection in the child before it freezes what it inherited, rank 0's collector
back at once, and what rank 0 learns of a child that does not start."""

from __future__ import annotations

import gc
import os
import signal
import time

import pytest

from hpinteract.trainer.stuck import describe, dumpable_child, no_collection_across_fork


def _fork(child) -> tuple[int, int]:
    """Fork under both guards; the child runs ``child(w)`` with the write end of a pipe and
    exits. Returns (pid, read end)."""
    r, w = os.pipe()
    with dumpable_child(), no_collection_across_fork():
        pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.close(r)
            child(w)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _read_all(fd: int) -> bytes:
    out = b""
    while chunk := os.read(fd, 4096):
        out += chunk
    os.close(fd)
    return out


def test_the_child_starts_with_the_collector_off_and_rank_0_gets_it_back():
    assert gc.isenabled()
    pid, r = _fork(lambda w: os.write(w, b"on" if gc.isenabled() else b"off"))
    assert _read_all(r) == b"off"
    assert os.waitpid(pid, 0)[1] == 0
    assert gc.isenabled()


def test_a_parent_that_had_turned_the_collector_off_keeps_it_off():
    gc.disable()
    try:
        pid, r = _fork(lambda w: os.write(w, b"x"))
        assert _read_all(r) == b"x"
        os.waitpid(pid, 0)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_no_finalizer_of_the_parents_garbage_runs_in_the_child_on_its_own():
    class Finalized:
        fd = -1  # the child's pipe, once forked

        def __init__(self) -> None:
            self.me = self  # a cycle: only a collection frees it

        def __del__(self) -> None:
            if self.fd >= 0:
                os.write(self.fd, b"finalized ")

    held = [Finalized()]  # alive in the parent: garbage in the child only

    def child(w: int) -> None:
        Finalized.fd = w
        held.clear()
        # Allocations enough to start many collections, were the collector on.
        junk = [[object() for _ in range(50)] for _ in range(20_000)]
        del junk
        os.write(w, b"done")

    pid, r = _fork(child)
    assert _read_all(r) == b"done"  # without the guard: b"finalized done"
    os.waitpid(pid, 0)
    held.clear()


def test_describe_says_where_a_stuck_child_is_and_its_stacks_go_to_stderr(capfd):
    def child(w: int) -> None:
        os.write(w, b"asleep")
        time.sleep(60)

    pid, r = _fork(child)
    try:
        assert os.read(r, 6) == b"asleep"
        deadline, said, err = time.monotonic() + 30, "", ""
        while time.monotonic() < deadline:  # on a loaded machine it may still be running
            said = describe(pid)
            err += capfd.readouterr().err
            if said.startswith(f"{pid} S") and "child" in err:
                break
        assert said.startswith(f"{pid} S"), said  # asleep
        assert "Current thread" in err or "Thread 0x" in err, err
        assert "child" in err, err  # its Python stack: in the function that sleeps
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
    assert describe(pid) == "no /proc entry"


@pytest.mark.parametrize("guard", [dumpable_child, no_collection_across_fork])
def test_the_guards_leave_rank_0_as_it_was_on_an_error(guard):
    before = signal.getsignal(signal.SIGUSR2), gc.isenabled()
    with pytest.raises(RuntimeError, match="in the fork"), guard():
        raise RuntimeError("in the fork")
    assert (signal.getsignal(signal.SIGUSR2), gc.isenabled()) == before
