"""Real torchrun jobs that fail, take launch overrides, or were started without hpi.launch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TOY, trace, wait_for_step

import hpinteract as hpi


def test_a_killed_rank_makes_the_job_failed_with_that_rank_named():
    job = hpi.launch(TOY, nproc=2, args=["--crash-rank", "1", "--crash-step", "15", "--kill"])
    assert job.wait(90) == hpi.JobState.FAILED
    err = job.error
    assert err is not None and err.rank == 1
    assert "SIGKILL" in err.message or err.exitcode == -9
    with pytest.raises(hpi.JobFailed, match="rank 1"):
        job.set(lr=0.1)
    assert job.events()["state"].dropna().iloc[-1] == "failed"


def test_a_rank_that_raises_fails_the_job_with_its_error_and_logs_kept():
    job = hpi.launch(TOY, nproc=2, args=["--crash-rank", "1", "--crash-step", "10"])
    assert job.wait(90) == hpi.JobState.FAILED
    assert job.error is not None and job.error.rank == 1
    assert "boom on purpose at step 10" in job.error.message
    assert "boom on purpose" in job.logs(rank=1)
    assert len(job.metrics()) >= 10  # the history up to the crash is all there


def test_launch_overrides_replace_the_script_defaults():
    job = hpi.launch(TOY, nproc=2, hparams={"lr": 0.2, "dropout": 0.5}, args=["--epochs", "1"])
    assert job.wait(90) == hpi.JobState.FINISHED, job.logs()
    assert job.hparams["lr"] == 0.2 and job.hparams["dropout"] == 0.5
    t = trace(job, 1)
    assert t[0]["lr"] == 0.2 and t[0]["dropout"] == 0.5


def test_an_invalid_launch_override_fails_the_job_naming_it():
    job = hpi.launch(TOY, nproc=2, hparams={"learning_rate": 0.2})
    assert job.wait(90) == hpi.JobState.FAILED
    assert "learning_rate" in job.error.message
    assert "InvalidHParam" in job.logs(rank=0)


def test_launch_rejects_a_missing_script_and_unsupported_values(tmp_path):
    with pytest.raises(FileNotFoundError):
        hpi.launch(tmp_path / "nope.py")
    with pytest.raises(hpi.InvalidHParam, match="lr"):
        hpi.launch(TOY, hparams={"lr": [0.1]})


def test_a_script_that_initialised_ddp_itself_under_plain_torchrun(hpi_home):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "HPINTERACT_HOME": str(hpi_home), "OMP_NUM_THREADS": "1"}
    env.pop("HPINTERACT_RUN_DIR", None)
    before = {j.id for j in hpi.jobs()}
    proc = subprocess.Popen([str(torchrun), "--standalone", "--nproc-per-node", "2",
                             str(Path(__file__).parents[1] / "jobs" / "preinit.py")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ({j.id for j in hpi.jobs()} - before):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
            time.sleep(0.1)
        job = hpi.attach("latest")
        wait_for_step(job, 3)
        ack = job.set(lr=0.05)
        assert job.applied_steps(ack.change_id) == {0: ack.applied_at_step,
                                                    1: ack.applied_at_step}
        job.stop()
        assert job.wait(60) == hpi.JobState.FINISHED
        assert proc.wait(60) == 0, proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_attach_and_jobs_find_runs_and_report_missing_ones():
    with pytest.raises(hpi.JobNotFound):
        hpi.attach("no-such-job")
    listed = hpi.jobs()
    assert listed and all(j.state in {s.value for s in hpi.JobState} for j in listed)
    newest = listed[-1].id
    assert hpi.attach("latest").id == newest
    assert hpi.attach(newest[:-1]).id == newest  # a unique prefix is enough


def test_a_script_run_with_plain_python_is_a_one_rank_job(hpi_home):
    env = {**os.environ, "HPINTERACT_HOME": str(hpi_home)}
    for var in ("HPINTERACT_RUN_DIR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    subprocess.run([sys.executable, str(TOY), "--epochs", "1", "--n", "64"], env=env,
                   check=True, timeout=120)
    job = hpi.attach("latest")
    assert job.state == hpi.JobState.FINISHED
    df = job.metrics()
    assert list(df["step"]) == list(range(64 // 16))
    assert job.status()["world_size"] == 1
