"""hang_timeout: a rank stuck in its own code while the other waits in its all-reduce ends
the job with both stacks and the stuck rank named with its frame; a slow step that finishes,
and a pause, are never called a hang; with restarts the job goes on from its checkpoint."""

from __future__ import annotations

import sys
import time

from helpers import TOY, wait_for_step

import hpinteract as hpi
from hpinteract.client.history import read_records
from hpinteract.trainer.watchdog import HANG_EXIT, frame_of

HANG = ["--crash-rank", "1", "--crash-step", "20", "--hang", "inf"]


def test_a_rank_stuck_in_its_own_code_is_named_with_its_frame():
    job = hpi.launch(TOY, nproc=2, hparams={"hang_timeout": 2.0}, args=HANG)
    assert job.wait(120) == hpi.JobState.FAILED
    err = job.error
    assert (err.rank, err.kind, err.step) == (1, "hang", 20)
    assert "did not reach the end of the step, at " in err.message
    assert "toy.py" in err.message and "in stuck_in_user_code" in err.message
    assert "hang_timeout=2" in err.message
    [waited] = err.consequences  # rank 0 waited in the all-reduce of the same step
    assert (waited["rank"], waited["kind"]) == (0, "waiting")
    assert "waited in a collective" in waited["message"]
    # Every rank's stack is in its logs; the stuck one's shows the user's function.
    assert "in stuck_in_user_code" in job.logs(rank=1)
    assert "Thread" in job.logs(rank=0) and "backward" in job.logs(rank=0)
    dumps = sorted(p.name for p in (job.run_dir.logs_dir / "hang").iterdir())
    assert dumps == ["attempt-0-rank-0.txt", "attempt-0-rank-1.txt"]
    # Nothing logged is lost: every step before the hang, once.
    steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    assert steps == list(range(20))


def test_a_hang_with_restarts_left_restarts_from_the_checkpoint():
    job = hpi.launch(TOY, nproc=2, max_restarts=1,
                     hparams={"hang_timeout": 2.0, "checkpoint_every": 8},
                     args=[*HANG, "--n", "512", "--epochs", "2"])  # 64 steps
    assert job.wait(180) == hpi.JobState.FINISHED, job.logs()
    ev = job.events()
    [restart] = ev[ev.kind == "restart"].to_dict("records")
    assert (restart["failed_rank"], restart["failed_kind"]) == (1, "hang")
    assert restart["error"].endswith("then rank 0 waited for it in a collective")
    assert restart["step"] == 16  # the newest checkpoint before the hang at step 20
    steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    assert steps == list(range(64))


def test_a_slow_step_that_finishes_and_a_pause_are_no_hang():
    job = hpi.launch(TOY, nproc=2, hparams={"hang_timeout": 3.0},
                     args=["--crash-rank", "1", "--crash-step", "10", "--hang", "2",
                           "--epochs", "2"])  # 32 steps, one of them 2 s long
    wait_for_step(job, 12)
    job.pause()
    time.sleep(4.0)  # longer than hang_timeout, paused
    job.resume()
    job.set(hang_timeout=4.0)  # live, as any other hyper-parameter
    assert job.wait(120) == hpi.JobState.FINISHED, job.logs()
    assert not (job.run_dir.path / "failures").exists()


def test_the_frame_named_is_the_scripts_own_not_the_libraries():
    def user_code():
        return frame_of(sys._getframe())

    found = user_code()
    assert found["function"] == "user_code" and found["file"] == __file__
    assert not found["waiting"]
    assert HANG_EXIT == 124
