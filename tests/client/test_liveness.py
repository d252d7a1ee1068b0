"""How a client tells a job that died without recording its end from one still running."""

import os
import socket
import subprocess
import sys
import time

from hpinteract.client.liveness import job_alive, pid_alive, process_alive, supervisor_running

HERE = {"hostname": socket.gethostname()}


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: the pid names no process now
    return p.pid


def test_a_pid_is_alive_while_its_process_runs():
    assert pid_alive(os.getpid())
    assert not pid_alive(dead_pid())


def test_an_exited_child_not_yet_reaped_is_not_alive():
    # Another node's supervisor launched from this same process: it exited, and nothing
    # has waited on it yet (the job of the first node asks about it by pid).
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while not _is_zombie(p.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _is_zombie(p.pid)  # exited, unreaped: kill(pid, 0) still succeeds
        os.kill(p.pid, 0)
        assert not pid_alive(p.pid)
    finally:
        p.wait()


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        return any(line.startswith("State:\tZ") for line in f)


def test_another_machines_job_or_no_pid_cannot_be_checked_from_here():
    assert process_alive(HERE, None) is None
    assert process_alive({"hostname": "elsewhere.invalid"}, os.getpid()) is None
    assert process_alive(HERE, os.getpid()) is True
    assert process_alive(HERE, dead_pid()) is False


def test_the_supervisor_this_process_started_is_polled_and_reaped():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert supervisor_running(lambda: HERE, p) is True

        def unread():  # the process this client started answers: job.json is not read
            raise AssertionError("job.json read")

        assert job_alive(unread, p, {"pid": dead_pid()})
    finally:
        p.kill()
        p.wait()
    assert supervisor_running(lambda: HERE, p) is False
    assert supervisor_running(lambda: {**HERE, "supervisor_pid": dead_pid()}, None) is False


def test_a_job_is_dead_only_when_that_is_known():
    assert job_alive(lambda: {**HERE, "supervisor_pid": os.getpid()}, None, {"pid": dead_pid()})
    assert not job_alive(lambda: {**HERE, "supervisor_pid": dead_pid()}, None, {"pid": os.getpid()})
    # A job torchrun started directly: rank 0's pid is its life.
    assert job_alive(lambda: HERE, None, {"pid": os.getpid()})
    assert not job_alive(lambda: HERE, None, {"pid": dead_pid()})
    # Another machine's job: only its state file can tell.
    elsewhere = {"hostname": "elsewhere.invalid", "supervisor_pid": 1}
    assert job_alive(lambda: elsewhere, None, {"pid": 1})


def test_a_torchrun_jobs_liveness_reads_job_json_once():
    reads = []

    def spec():
        reads.append(1)
        return HERE

    assert not job_alive(spec, None, {"pid": dead_pid()})  # no supervisor: rank 0's pid
    assert len(reads) == 1
