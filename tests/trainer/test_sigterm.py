"""SIGTERM (torchrun stopping the survivors of a failure, a scheduler's preemption) ends a
rank through its excepthook, so rank 0 writes its logs and its end before it exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from helpers import TOY, wait_for_step

import hpinteract as hpi
from hpinteract.client.history import read_records
from hpinteract.protocol.connection import ConnectionInfo
from hpinteract.protocol.failures import is_peer_loss
from hpinteract.trainer.sigterm import MESSAGE


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)


def test_sigterm_raises_terminated_in_the_main_thread():
    out = _python("""
        import os, signal
        from hpinteract.trainer.sigterm import SigtermGuard, Terminated
        guard = SigtermGuard(lambda: False)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10**6): pass
        except Terminated as e:
            print("raised:", e)
        guard.restore(deliver=True)
        print("default again:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    """)
    assert out.returncode == 0, out.stderr
    assert f"raised: {MESSAGE}" in out.stdout and "default again: True" in out.stdout


def test_a_sigterm_during_the_end_waits_for_it_and_then_ends_the_process():
    out = _python("""
        import os, signal
        from hpinteract.trainer.sigterm import SigtermGuard
        guard = SigtermGuard(lambda: True)   # the run is writing its end
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10**5): pass
        print("end written", guard.pending, flush=True)
        guard.restore(deliver=True)
        print("not reached")
    """)
    assert out.stdout.split() == ["end", "written", "True"]
    assert out.returncode == -signal.SIGTERM


def test_a_scripts_own_handler_is_left_alone():
    out = _python("""
        import signal
        from hpinteract.trainer.sigterm import SigtermGuard
        mine = lambda *a: None
        signal.signal(signal.SIGTERM, mine)
        SigtermGuard(lambda: False)
        print(signal.getsignal(signal.SIGTERM) is mine)
    """)
    assert out.stdout.strip() == "True", out.stderr


def test_terminated_counts_as_a_consequence_not_a_cause():
    assert is_peer_loss(f"hpinteract.trainer.sigterm.Terminated: {MESSAGE}")


def test_a_sigtermed_job_writes_every_step_and_its_own_end():
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.01},
                     args=["--n", "4096", "--epochs", "5"])
    wait_for_step(job, 15)
    rank0 = ConnectionInfo.read(job.run_dir.connection).pid  # where the coordinator lives
    os.kill(rank0, signal.SIGTERM)
    assert job.wait(60).value == "failed"
    ev = job.events()
    # Rank 0 recorded its end itself (not as the cause: only the supervisor knows that),
    # before the supervisor's record of the job's end.
    ends = ev[ev.kind == "state"].tail(2)
    assert list(zip(ends.state, ends.source, strict=True)) == [("failing", "job"),
                                                              ("failed", "supervisor")]
    assert (job.error.rank, job.error.kind) == (0, "stopped")
    assert "stopped by SIGTERM" in job.logs()
    steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    assert steps == list(range(len(steps))) and len(steps) >= 16
    # Every step rank 0 published is on disk: the status it last posted names no later one.
    assert job.status()["latest"]["step"] <= steps[-1]
