"""The root cause of a failed attempt, from torchrun's exit statuses and the ranks' own
records: the kind of failure decides before its time (a survivor's broken connection is
never the cause), and every other failure is listed as a consequence."""

from __future__ import annotations

import pytest

from hpinteract.protocol.failures import (
    attempt_cause,
    cause,
    latest_cause,
    merge,
    read_rank_failures,
    signal_name,
    summary,
    write_rank_failure,
    write_seen,
)
from hpinteract.protocol.rundir import RunDir

PEER = ("RuntimeError: [gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:4242: "
        "Connection reset by peer")


def test_a_rank_killed_by_a_signal_is_the_cause_not_the_survivor_that_lost_it():
    failures = {
        # the survivor raised first and its record is more precise in time
        0: merge(0, {"exitcode": 1, "pid": 8, "timestamp": 100.0, "message": PEER}, None),
        1: merge(1, {"exitcode": -9, "pid": 9, "timestamp": 101.0, "message": None}, None),
    }
    root = cause(failures, step=31)
    assert (root["rank"], root["kind"], root["signal"], root["pid"]) == (1, "signal", "SIGKILL", 9)
    assert root["message"] == "killed by SIGKILL (signal 9) during step 31"
    assert root["consequences"] == [{"rank": 0, "kind": "lost_peer", "message": PEER,
                                     "exitcode": 1, "signal": None}]
    assert summary(root) == ("rank 1 failed: killed by SIGKILL (signal 9) during step 31; "
                             "then rank 0 lost its peer")


def test_an_exception_beats_a_signal_and_the_earliest_wins_within_a_kind():
    own = {"kind": "exception", "type": "ValueError", "message": "b", "time": 5.0, "step": 3}
    earlier = {**own, "message": "a", "time": 3.0}
    failures = {0: merge(0, {"exitcode": 1}, own), 1: merge(1, {"exitcode": 1}, earlier),
                2: merge(2, {"exitcode": -11}, None)}
    root = cause(failures)
    assert (root["rank"], root["message"], root["step"]) == (1, "a", 3)
    assert [c["rank"] for c in root["consequences"]] == [0, 2]


@pytest.mark.parametrize(("seen", "own", "kind", "message"), [
    ({"exitcode": 3}, None, "exit", "exited with code 3 without raising an exception"),
    ({"exitcode": -15}, None, "stopped", "killed by SIGTERM (signal 15)"),
    ({"exitcode": 1, "message": PEER}, None, "lost_peer", PEER),
    ({"exitcode": 1, "message": "ValueError: x"}, None, "exception", "ValueError: x"),
    (None, {"kind": "exit", "message": "exited with code 2"}, "exit", "exited with code 2"),
])
def test_each_kind_of_failure_is_told_from_what_was_seen(seen, own, kind, message):
    failure = merge(4, seen, own)
    assert (failure["kind"], failure["message"]) == (kind, message)


def test_only_lost_peers_blame_no_rank():
    root = cause({0: merge(0, {"exitcode": 1, "message": PEER}, None)})
    assert root["rank"] is None and root["kind"] == "lost_peer"
    assert root["message"].startswith("rank 0 lost a peer that left no record of its own")
    assert summary(root).startswith("the job failed: rank 0 lost a peer")


def test_an_oom_kill_is_said_only_when_the_kernel_counted_one():
    failures = {1: merge(1, {"exitcode": -9}, None)}
    assert "OOM" not in cause(failures)["message"]
    root = cause(failures, oom_killed=True)
    assert root["oom_kill"] is True and "OOM killer ran" in root["message"]
    assert signal_name(-9) == "SIGKILL" and signal_name(0) is None and signal_name(None) is None


def test_an_attempts_cause_joins_torchruns_view_and_the_ranks_records(tmp_path):
    run_dir = RunDir.create(root=tmp_path)
    assert attempt_cause(run_dir, 0) is None and latest_cause(run_dir) is None
    write_rank_failure(run_dir, 0, 0, 30, "RuntimeError", PEER, "Traceback ...")
    write_rank_failure(run_dir, 1, 1, 12, "ValueError", "boom", "Traceback (boom)")
    write_seen(run_dir, 0, {1: {"exitcode": -9, "pid": 77, "timestamp": 5.0, "message": None}},
               step=31, oom_killed=False)
    assert set(read_rank_failures(run_dir, 0)) == {0}
    mode = (run_dir.path / "failures" / "attempt-0" / "rank-0.json").stat().st_mode
    assert mode & 0o077 == 0  # owner-only, as the whole run directory
    root = attempt_cause(run_dir, 0)
    assert (root["rank"], root["signal"], root["step"], root["pid"]) == (1, "SIGKILL", 31, 77)
    assert root["consequences"][0]["rank"] == 0
    latest = latest_cause(run_dir)  # attempt 1: rank 1's own exception, with its traceback
    assert (latest["rank"], latest["kind"], latest["message"], latest["traceback"]) == (
        1, "exception", "boom", "Traceback (boom)")
