"""The supervisor's reading of how torchrun ended: the root cause, and a rank killed by a
signal once its work was safe. torchrun itself is replaced here (a unit below it); the
real thing is exercised by the job tests (test_resize.py, test_restarts.py)."""

import os
from types import SimpleNamespace as F

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from hpinteract.client.history import read_records
from hpinteract.protocol.rundir import RunDir, atomic_write_json, read_json
from hpinteract.trainer import supervisor
from hpinteract.trainer.resize import ENV as RESIZED_ENV
from hpinteract.trainer.resize import RECORD
from hpinteract.trainer.supervisor import error_of, root_cause


def test_a_peers_communication_error_is_not_taken_for_the_root_cause():
    failures = {
        0: F(message="RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                     "[127.0.0.1]:4242", timestamp=100, exitcode=1),
        1: F(message="Signal 9 (SIGKILL) received by PID 7", timestamp=101, exitcode=-9),
    }
    assert root_cause(failures)[0] == 1


def test_otherwise_the_earliest_failure_wins():
    failures = {0: F(message="ValueError: b", timestamp=5, exitcode=1),
                1: F(message="ValueError: a", timestamp=3, exitcode=1)}
    assert root_cause(failures)[0] == 1
    only_peers = {2: F(message="Connection reset by peer", timestamp=9, exitcode=1)}
    assert root_cause(only_peers)[0] == 2


def test_the_error_names_the_root_cause_and_its_exit_code():
    abort = F(message="Signal 6 (SIGABRT) received by PID 9", timestamp=1, exitcode=-6, pid=9)
    peer = F(message="Connection closed by peer", timestamp=0, exitcode=1, pid=8)
    assert error_of({1: abort, 0: peer}) == {"rank": 1, "exitcode": -6, "pid": 9,
                                             "message": abort.message}


def _aborted(*_args, **_kwargs):
    raise ChildFailedError("bootstrap", {1: ProcessFailure(1, 4242, -6, "/nonexistent")})


def _job(tmp_path) -> RunDir:
    run_dir = RunDir.create(root=tmp_path)
    atomic_write_json(run_dir.job_file, {"nproc": 2, "script": "x.py"})
    return run_dir


def test_a_rank_killed_after_rank_0_recorded_a_resize_lets_the_resize_go_on(tmp_path,
                                                                           monkeypatch):
    run_dir = _job(tmp_path)
    starts = []
    # main() hands the record to the next torchrun's ranks in its (own) environment: here
    # that is this test process's, put back afterwards.
    monkeypatch.setenv(RESIZED_ENV, "")

    def torchrun(_args):
        starts.append(read_json(run_dir.job_file)["nproc"])
        if len(starts) == 1:  # rank 0 left a record, then rank 1 aborted at teardown
            atomic_write_json(run_dir.path / RECORD, {"from": 2, "to": 1, "step": 7})
            _aborted()

    monkeypatch.setattr(supervisor, "torchrun", torchrun)
    assert supervisor.main(str(run_dir.path)) == 0
    assert starts == [2, 1]  # started again with the new size
    [warning] = [e for e in read_records(run_dir.events_log) if e["kind"] == "warning"]
    assert "rank 1 died after leaving for a resize: Signal 6 (SIGABRT)" in warning["message"]
    assert read_json(run_dir.state_file)["state"] == "finished"
    assert '"to": 1' in os.environ[RESIZED_ENV]


def test_a_stale_resize_record_never_turns_a_failure_into_a_resize(tmp_path, monkeypatch):
    """A record from before this supervisor (a resize whose end failed, then resume=)."""
    run_dir = _job(tmp_path)
    atomic_write_json(run_dir.path / RECORD, {"from": 2, "to": 1, "step": 7})
    monkeypatch.setenv(RESIZED_ENV, "")  # were it taken for a resize (see above)
    starts = []
    monkeypatch.setattr(supervisor, "torchrun", lambda args: starts.append(1) or _aborted())
    assert supervisor.main(str(run_dir.path)) == 1
    assert len(starts) == 1  # not started again as if resized
    assert not [e for e in read_records(run_dir.events_log) if e["kind"] == "warning"]
    state = read_json(run_dir.state_file)
    assert state["state"] == "failed" and state["error"]["exitcode"] == -6
    assert not (run_dir.path / RECORD).exists()
