"""Real 2-rank jobs that break as they do in the field: the client is told the rank that
failed, how (its signal or exit code) and at which step, never the survivor that only lost
its connection, not even for a moment (docs/RELIABILITY.md, "Failures")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import TOY, rank_pid, wait_for_step

import hpinteract as hpi


def _watch_until_ended(job: hpi.Job) -> list[tuple[str, object]]:
    """Every (state, error) a client polling the job saw until its end, in order."""
    seen: list[tuple[str, object]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # The error first: the supervisor writes state and error in one file at once, and
        # two reads (state, then error) can straddle that write; a cause read first was
        # there before the state read after it.
        error = job.error
        state = job.state
        if not seen or seen[-1] != (state.value, error):
            seen.append((state.value, error))
        if state.terminal:
            return seen
        time.sleep(0.005)
    raise AssertionError(f"the job did not end: {seen}")


def test_a_rank_killed_from_outside_is_named_with_its_signal_and_step():
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.004})
    wait_for_step(job, 25)
    os.kill(rank_pid(job, 1), signal.SIGKILL)  # wherever it is: usually in its all-reduce
    seen = _watch_until_ended(job)
    # Until the supervisor has the exit statuses, no client is told any cause, and
    # never the survivor's broken connection.
    assert all(err is None for state, err in seen if state != "failed"), seen
    assert {state for state, _ in seen} <= {"running", "failing", "failed"}
    err = job.error
    assert (err.rank, err.kind, err.signal, err.exitcode) == (1, "signal", "SIGKILL", -9)
    last = int(job.metrics().step.max())
    assert err.step == last + 1  # the step it died in: the one after the last logged
    assert err.message == f"killed by SIGKILL (signal 9) during step {err.step}"
    assert [(c["rank"], c["kind"]) for c in err.consequences] == [(0, "lost_peer")]
    assert "Connection" in err.consequences[0]["message"]
    assert str(err).endswith("; then rank 0 lost its peer")
    with_error = job.events().dropna(subset=["error"])
    assert with_error.iloc[-1].source == "supervisor"  # the only terminal account


def test_rank_0_killed_is_named_too():
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.004})
    wait_for_step(job, 25)
    os.kill(rank_pid(job, 0), signal.SIGKILL)
    assert job.wait(60) == hpi.JobState.FAILED
    err = job.error
    assert (err.rank, err.signal) == (0, "SIGKILL")
    assert [c["rank"] for c in err.consequences] == [1]


def test_a_rank_that_exits_with_a_code_is_named_with_it():
    job = hpi.launch(TOY, nproc=2, args=["--crash-rank", "1", "--crash-step", "12",
                                         "--exit", "3"])
    assert job.wait(90) == hpi.JobState.FAILED
    err = job.error
    assert (err.rank, err.kind, err.exitcode, err.step) == (1, "exit", 3, 12)
    assert err.message == "exited with code 3 during step 12"
    assert str(err).startswith("rank 1 failed: exited with code 3 during step 12")


def test_rank_0_exiting_with_a_code_is_no_clean_end():
    """Before, rank 0's exit handler took ``sys.exit(3)`` for the end of the script and
    wrote ``finished``, which a client read as final until the supervisor knew better."""
    job = hpi.launch(TOY, nproc=2, args=["--crash-rank", "0", "--crash-step", "12",
                                         "--exit", "3"])
    seen = _watch_until_ended(job)
    assert "finished" not in {state for state, _ in seen}, seen
    assert (job.error.rank, job.error.kind, job.error.exitcode) == (0, "exit", 3)


def test_under_plain_torchrun_the_ranks_records_tell_the_cause():
    """No supervisor: once rank 0's process is gone, a client reads the job as failed and
    takes the cause from what the ranks recorded."""
    torchrun = Path(sys.executable).with_name("torchrun")
    before = {j.id for j in hpi.jobs()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPINTERACT_RUN_DIR",
                                                                     "HPINTERACT_SUPERVISED"))}
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", str(TOY),
         "--crash-rank", "1", "--crash-step", "10"],
        env=env, capture_output=True, timeout=120, check=False)
    assert proc.returncode != 0
    [new] = [j for j in hpi.jobs() if j.id not in before]
    job = hpi.attach(new.id)
    assert job.state == hpi.JobState.FAILED
    err = job.error
    assert (err.rank, err.kind, err.step) == (1, "exception", 10)
    assert err.message == "boom on purpose at step 10" and "Traceback" in err.traceback
    assert [(c["rank"], c["kind"]) for c in err.consequences] in (
        [(0, "lost_peer")], [(0, "stopped")])
