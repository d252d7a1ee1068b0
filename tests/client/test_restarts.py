"""``hpi.launch(max_restarts=N)``: a rank that dies makes torchrun restart the workers,
which continue from the newest checkpoint with the change history in force; the events
show the restart and the steps lost, the metrics log has every step once, and a Job (its
control client and its stream) follows the new coordinator by itself."""

from __future__ import annotations

import threading

from helpers import TOY, trace, wait_for_step

import hpinteract as hpi
from hpinteract.client.history import read_records

N, EPOCHS = 2048, 2  # 128 steps an epoch, 256 in all
CRASH = 90


def test_a_killed_rank_restarts_the_job_from_its_checkpoint_with_its_changes():
    # lr given at launch too: the restart must not put the launch's 0.05 back over 0.02.
    job = hpi.launch(TOY, nproc=2, max_restarts=1,
                     hparams={"sleep": 0.004, "checkpoint_every": 20, "lr": 0.05},
                     args=["--n", str(N), "--epochs", str(EPOCHS), "--crash-rank", "1",
                           "--crash-step", str(CRASH), "--kill"])
    seen: list[dict] = []
    follower = threading.Thread(target=lambda: seen.extend(job.stream()), daemon=True)
    follower.start()
    wait_for_step(job, 5)
    change = job.set(lr=0.02, dropout=0.3)  # before the checkpoint the restart goes back to

    assert job.wait(180).value == "finished", job.logs()
    follower.join(30)
    ev = job.events()
    [restart] = ev[ev.kind == "restart"].to_dict("records")
    s = int(restart["step"])
    assert change.applied_at_step < s <= CRASH  # so the change must come back from it
    assert restart["restart"] == 1 and restart["source"] == "torchrun"
    assert restart["steps_lost"] >= CRASH - s - 1
    # The victim is named (the supervisor saw its exit status), not the survivor.
    assert restart["failed_rank"] == 1 and restart["signal"] == "SIGKILL"
    assert restart["error"].startswith(
        f"rank 1 failed: killed by SIGKILL (signal 9) during step {CRASH}; then rank 0 ")
    assert restart["failed_step"] == CRASH
    assert restart["checkpoint"].endswith(f"{s:09d}.pt")

    # The restarted ranks ran from the checkpoint's step to the end with the changed values.
    for r in (0, 1):
        rows = trace(job, r)
        assert [t["step"] for t in rows] == list(range(s, EPOCHS * N // 16))
        assert {t["lr"] for t in rows} == {0.02} and {t["dropout"] for t in rows} == {0.3}
    steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    assert steps == list(range(EPOCHS * N // 16))  # each step once, none missing

    # The stream followed the new coordinator: every record once, in order, the restart
    # event among them and the steps after it all there.
    seqs = [r["seq"] for r in seen]
    assert seqs == sorted(set(seqs))
    assert any(r.get("kind") == "restart" for r in seen)
    after = {r["step"] for r in seen if "kind" not in r and r["seq"] > restart["seq"]}
    assert after == set(range(s, EPOCHS * N // 16))
    states = ev[ev.kind == "state"].state.tolist()
    assert states.count("running") == 2 and states[-1] == "finished"


def test_a_job_that_keeps_failing_fails_when_its_restarts_are_spent():
    job = hpi.launch(TOY, nproc=2, max_restarts=1,
                     hparams={"sleep": 0.002, "checkpoint_every": 10},
                     args=["--n", str(N), "--crash-rank", "1", "--crash-step", "30",
                           "--crash-always"])
    assert job.wait(180).value == "failed"
    assert job.error is not None and job.error.rank == 1
    assert "boom on purpose at step 30" in job.error.message
    ev = job.events()
    [restart] = ev[ev.kind == "restart"].to_dict("records")
    assert restart["failed_rank"] == 1 and "boom on purpose" in restart["error"]
