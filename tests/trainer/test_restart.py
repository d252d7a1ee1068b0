"""What the restart event says made the previous torchrun attempt fail, from the ranks'
error files: the rank that raised for its own reasons, not the peers that lost it."""

from __future__ import annotations

import json

from hpinteract.protocol.rundir import RunDir
from hpinteract.trainer.restart import attempt, previous_failure, restarts_left

PEER = ("RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:58087")


def _error_file(run_dir: RunDir, attempt_no: int, rank: int, message: str) -> None:
    d = run_dir.logs_dir / "torchrun" / "abc_1" / f"attempt_{attempt_no}" / str(rank)
    d.mkdir(parents=True)
    (d / "error.json").write_text(json.dumps({"message": {"message": message}}))


def test_the_rank_that_raised_is_named_not_its_peers(tmp_path):
    run_dir = RunDir.create(root=tmp_path)
    _error_file(run_dir, 0, 0, PEER)
    _error_file(run_dir, 0, 1, "RuntimeError: boom at step 30")
    _error_file(run_dir, 1, 0, "ValueError: another attempt")
    assert previous_failure(run_dir, 0) == {"failed_rank": 1,
                                            "error": "RuntimeError: boom at step 30"}


def test_a_rank_killed_by_a_signal_is_told_of_by_its_peers(tmp_path):
    run_dir = RunDir.create(root=tmp_path)
    _error_file(run_dir, 0, 0, PEER)
    failure = previous_failure(run_dir, 0)
    assert failure["failed_rank"] is None
    assert "rank(s) 0 lost a peer" in failure["error"] and "Connection closed" in failure["error"]
    assert previous_failure(run_dir, 3)["failed_rank"] is None  # no files at all


def test_attempts_come_from_torchruns_environment(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    assert attempt() == 1 and restarts_left() == 2
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS")
    assert attempt() == 0 and restarts_left() == 0
