"""What the restart event says made the previous torchrun attempt fail: the rank that
failed for its own reasons (an exception, a signal), not the peers that lost it."""

from __future__ import annotations

import json

from hpinteract.protocol.failures import write_rank_failure, write_seen
from hpinteract.protocol.rundir import RunDir
from hpinteract.trainer.restart import attempt, previous_failure, restarts_left

PEER = ("RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:58087")


def _error_file(run_dir: RunDir, attempt_no: int, rank: int, message: str) -> None:
    d = run_dir.logs_dir / "torchrun" / "abc_1" / f"attempt_{attempt_no}" / str(rank)
    d.mkdir(parents=True)
    (d / "error.json").write_text(json.dumps({"message": {"message": message}}))


def test_the_rank_that_raised_is_named_not_its_peers(tmp_path):
    """Where only torchrun's error files tell (no supervisor's or rank's record)."""
    run_dir = RunDir.create(root=tmp_path)
    _error_file(run_dir, 0, 0, PEER)
    _error_file(run_dir, 0, 1, "RuntimeError: boom at step 30")
    _error_file(run_dir, 1, 0, "ValueError: another attempt")
    failure = previous_failure(run_dir, 0)
    assert (failure["failed_rank"], failure["failed_kind"]) == (1, "exception")
    assert failure["error"] == ("rank 1 failed: RuntimeError: boom at step 30; then rank 0 "
                                "lost its peer")


def test_a_rank_killed_by_a_signal_is_named_from_the_supervisors_record(tmp_path):
    run_dir = RunDir.create(root=tmp_path)
    write_rank_failure(run_dir, 0, 0, 40, "RuntimeError", PEER, "")
    write_seen(run_dir, 0, {1: {"exitcode": -9, "pid": 5, "timestamp": 1.0, "message": None}},
               step=41, oom_killed=False)
    failure = previous_failure(run_dir, 0)
    assert (failure["failed_rank"], failure["signal"], failure["failed_step"]) == (
        1, "SIGKILL", 41)
    assert failure["error"].startswith("rank 1 failed: killed by SIGKILL (signal 9) during "
                                       "step 41; then rank 0 lost its peer")
    assert previous_failure(run_dir, 3)["failed_rank"] is None  # nothing recorded at all


def test_attempts_come_from_torchruns_environment(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    assert attempt() == 1 and restarts_left() == 2
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS")
    assert attempt() == 0 and restarts_left() == 0
