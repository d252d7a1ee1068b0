"""The coordinator in a process of its own (hpinteract/trainer/control_process.py and
forked.py), with real 2-rank jobs: where it runs, what it does when rank 0 dies, and the
thread it can still be (HPINTERACT_COORDINATOR=thread)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
import zmq
from helpers import TOY, proc_stat, wait_for_step

import hpinteract as hpi
from hpinteract.client.history import read_records
from hpinteract.protocol.connection import ConnectionInfo
from hpinteract.trainer.forked import NAME
from hpinteract.transport.pubsub import Subscriber

PROCESS = {"HPINTERACT_COORDINATOR": "process"}  # opt-in (control_process.process_wanted)


def _children(pid: int) -> dict[int, str]:
    """pid -> name of the processes whose parent is ``pid``."""
    stats = {int(p.name): proc_stat(p) for p in Path("/proc").iterdir() if p.name.isdigit()}
    return {p: st[0] for p, st in stats.items() if st is not None and int(st[1][1]) == pid}


def _nice(task: str) -> int:
    """The nice value of a process or thread (``/proc/<pid>`` or ``.../task/<tid>``)."""
    st = proc_stat(task)
    assert st is not None, f"{task} is gone"
    return int(st[1][16])


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = proc_stat(f"/proc/{pid}")
        if st is None or st[1][0] == "Z":  # exited (reaped, or not yet)
            return True
        time.sleep(0.02)
    return False


def _end(job: hpi.Job) -> None:
    """A failed test leaves no job running."""
    if not job.state.terminal:
        with contextlib.suppress(hpi.HpiError):
            job.stop()
            job.wait(60)


def test_the_coordinator_is_a_child_of_rank_0_and_dies_with_it_keeping_the_logs():
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.004},
                     env={**PROCESS, "HPINTERACT_COORDINATOR_NICE": "10"})
    try:
        wait_for_step(job, 20)
        rank0 = ConnectionInfo.read(job.run_dir.connection).pid
        state = json.loads(job.run_dir.state_file.read_text())
        assert state["pid"] == rank0  # clients see rank 0's pid, not the child's
        coordinators = [p for p, name in _children(rank0).items() if name == NAME]
        assert len(coordinators) == 1
        # All its threads (ZeroMQ's I/O threads too) run 10 below rank 0, or at 19.
        base = _nice(f"/proc/{rank0}")
        niced = {t: _nice(f"/proc/{coordinators[0]}/task/{t}")
                 for t in os.listdir(f"/proc/{coordinators[0]}/task")}
        assert len(niced) >= 2 and set(niced.values()) == {min(19, base + 10)}, (base, niced)
        ack = job.set(lr=0.021, dropout=0.3)  # served by the child, applied by the ranks
        assert ack.applied_at_step > 0 and job.hparams["lr"] == 0.021
        seen = wait_for_step(job, ack.applied_at_step + 3)

        os.kill(rank0, signal.SIGKILL)
        assert _gone(coordinators[0], 10)  # it noticed its parent's death and ended
        assert job.wait(60).value == "failed"
        steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
        assert steps == list(range(len(steps))) and steps[-1] >= seen  # it wrote what it had
        events = read_records(job.run_dir.events_log)
        assert any(e.get("kind") == "change" and e["id"] == ack.change_id for e in events)
    finally:
        _end(job)


@pytest.mark.parametrize("mode", ["", "process"])
def test_either_coordinator_serves_changes_checkpoints_and_the_end(mode):
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.003},
                     env={"HPINTERACT_COORDINATOR": mode})  # "": the default, the thread
    try:
        wait_for_step(job, 10)
        rank0 = ConnectionInfo.read(job.run_dir.connection).pid
        assert (NAME in _children(rank0).values()) == (mode == "process")
        with pytest.raises(hpi.InvalidHParam, match="dropout"):
            job.set(dropout=5.0)  # validated where the requests are served
        ack = job.set(batch_size=32)  # checked against micro_batch, as rank 0 has it now
        saved = job.checkpoint()
        assert saved.applied_at_step >= ack.applied_at_step
        assert job.checkpoints()[-1]["step"] == saved.applied_at_step
        job.pause()
        with pytest.raises(hpi.InvalidHParam, match="it is paused"):
            job.set(workers=1)  # the coordinator knows rank 0 is paused
        job.resume()
        stop = job.stop()
        assert job.wait(60) == hpi.JobState.FINISHED
        assert stop.applied_at_step >= saved.applied_at_step
    finally:
        _end(job)


def test_the_last_records_and_the_end_reach_a_live_subscriber_before_it_exits():
    """The coordinator process publishes its last batch as it closes and exits right after:
    the batch must still go out on the socket (found: it was dropped, and a dashboard got
    the job's last steps only from the history, after its idle timeout)."""
    # 1 epoch of 2048 samples, 16 a step: the script ends by itself after 128 steps, its
    # last records posted a moment before the end, as a real script's are.
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.01},
                     args=["--epochs", "1", "--n", "2048"], env=PROCESS)
    try:
        wait_for_step(job, 5)
        info = ConnectionInfo.read(job.run_dir.connection)
        ctx: zmq.Context = zmq.Context()
        sub = Subscriber(ctx, info.pub_url, info.key_bytes, info.server_key)
        live: list[dict] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(live) < 5:  # connected and receiving
            live += sub.recv(1.0) or []
        while (batch := sub.recv(5.0)) is not None:  # raw PUB: no catch-up from history
            live += batch
        assert job.wait(60) == hpi.JobState.FINISHED
        sub.close()
        ctx.term()
    finally:
        _end(job)
    steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    assert max(r["step"] for r in live if "kind" not in r) == steps[-1]
    assert any(r.get("kind") == "state" and r.get("state") == "finished" for r in live)


def test_a_coordinator_process_that_does_not_start_leaves_the_thread_serving(
        tmp_path, monkeypatch, caplog, capfd):
    """A child that never reports ready is killed, and the job goes on with the thread
    (the starts that hung in the suite must not be able to fail a job); the warning says
    what the child's threads were doing, and the child wrote its Python stack first."""
    from hpinteract.client.history import read_records as records
    from hpinteract.protocol.rundir import RunDir
    from hpinteract.protocol.states import JobState
    from hpinteract.trainer import control_process as cp
    from hpinteract.trainer.coordinator import Coordinator
    from hpinteract.trainer.store import HParamStore

    children: list[int] = []

    def silent(sock, parent, **_):  # the child: alive, never ready
        while True:
            time.sleep(60)

    monkeypatch.setenv("HPINTERACT_COORDINATOR", "process")
    monkeypatch.setattr(cp, "serve_forked", silent)
    monkeypatch.setattr(cp, "START_S", 1.0)
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: children.append(pid := real_fork()) or pid)
    run_dir = RunDir.create(root=tmp_path)
    plane = cp.control_plane(run_dir, store=HParamStore({}), world_size=1, ip="127.0.0.1",
                             policies=[], resumed=None, facts=dict)
    try:
        assert isinstance(plane, Coordinator)
        assert len(children) == 1 and _gone(children[0], 10)  # killed and reaped
        info = ConnectionInfo.read(run_dir.connection)
        assert info.pid == os.getpid()  # the thread's own file
        assert "did not report ready within 1 s (its threads: " in caplog.text
        assert f"{children[0]} S in " in caplog.text  # asleep, and where (the kernel's word)
        assert "in silent" in capfd.readouterr().err  # its stack, from the inherited handler
        # Rank 0 got its own handler for the signal back: the default, not faulthandler's.
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    finally:
        plane.close(JobState.FINISHED)
    events = [e for e in records(run_dir.events_log) if e.get("kind") == "coordinator"]
    assert len(events) == 1 and events[0]["mode"] == "thread"
    assert "did not report ready" in events[0]["error"]


def test_the_mode_is_a_thread_unless_told_and_a_wrong_one_is_named(monkeypatch):
    from hpinteract.trainer.control_process import process_wanted

    monkeypatch.delenv("HPINTERACT_COORDINATOR", raising=False)
    assert not process_wanted()  # the default
    monkeypatch.setenv("HPINTERACT_COORDINATOR", " Process ")
    assert process_wanted()  # Linux
    monkeypatch.setenv("HPINTERACT_COORDINATOR", "proces")
    with pytest.raises(hpi.ConfigError, match=r"HPINTERACT_COORDINATOR='proces'.*thread, process"):
        process_wanted()


def test_a_wrong_coordinator_setting_is_refused_at_launch_and_by_rank_0(monkeypatch, hpi_home):
    from hpinteract.protocol import settings

    jobs = hpi_home / "jobs"
    before = set(jobs.iterdir()) if jobs.exists() else set()
    with pytest.raises(hpi.ConfigError, match="HPINTERACT_COORDINATOR='threads'"):
        hpi.launch(TOY, nproc=2, env={"HPINTERACT_COORDINATOR": "threads"})
    assert (set(jobs.iterdir()) if jobs.exists() else set()) == before  # nothing started
    # A job started by torchrun itself has no launch to check it: rank 0 does.
    monkeypatch.setattr(settings, "check", lambda env: None)  # this (the client) process only
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.003},
                     env={"HPINTERACT_COORDINATOR_NICE": "ten"})
    try:
        assert job.wait(90) == hpi.JobState.FAILED
        assert "HPINTERACT_COORDINATOR_NICE='ten'" in str(job.error)
    finally:
        _end(job)
