"""What a ``kill -9`` of the whole job (supervisor, agent and every rank at once) leaves:
readable logs with each step once, every acknowledged change in the events log, a job
that reads as failed, and one that resumes from its checkpoint (docs/RELIABILITY.md)."""

from __future__ import annotations

import os
import signal

from helpers import TOY, job_pids, wait_for_step

import hpinteract as hpi
from hpinteract.client.history import read_records


def test_a_job_killed_outright_keeps_its_logs_and_its_acknowledged_changes():
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.004})
    wait_for_step(job, 30)
    saved = job.checkpoint().applied_at_step  # the changes below come after it
    acks = [job.set(dropout=round(0.1 + 0.05 * i, 2)) for i in range(4)]
    seen = wait_for_step(job, acks[-1].applied_at_step + 3)
    pids = job_pids(job.run_dir.path)
    assert len(pids) >= 3  # supervisor (with torchrun's agent) and two ranks
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert job.wait(30).value == "failed"  # nothing recorded an end: it reads as failed

    steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    assert steps == list(range(len(steps))) and steps[-1] >= seen - 1
    changes = {e["id"] for e in read_records(job.run_dir.events_log)
               if e.get("kind") == "change"}
    assert {a.change_id for a in acks} <= changes  # in the log before they were acked
    assert "Traceback" not in job.logs()  # the supervisor's log is readable as it is

    assert job.checkpoints()[-1]["step"] == saved
    again = hpi.launch(resume=job.id)
    try:
        wait_for_step(again, steps[-1] + 5)
        # The person's decisions after the checkpoint are made again, at their steps.
        assert again.hparams["dropout"] == acks[-1].values["dropout"]
    finally:
        again.stop()
        again.wait(60)
    steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    assert steps == list(range(len(steps)))  # each step once across the kill and resume
    events = read_records(job.run_dir.events_log)
    redone = {e["reason"].split()[-1]: e["applied_at_step"] for e in events
              if e.get("kind") == "change" and e["source"] == "reapplied:api"}
    assert redone == {a.change_id: a.applied_at_step for a in acks}  # same ones, same steps
