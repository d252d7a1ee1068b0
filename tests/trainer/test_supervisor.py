"""The supervisor's reading of how torchrun ended: the root cause, and a rank killed by a
signal once its work was safe. torchrun itself is replaced here (a unit below it); the
real thing is exercised by the job tests (test_resize.py, test_restarts.py)."""

import os

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from hpinteract.client.history import read_records
from hpinteract.protocol.rundir import RunDir, atomic_write_json, read_json
from hpinteract.trainer import supervisor
from hpinteract.trainer.resize import RECORD
from hpinteract.trainer.restart import RESIZED_ENV, SUPERVISED_ENV
from hpinteract.trainer.supervisor import error_of


def _recorded(run_dir: RunDir, failures: dict) -> supervisor.AttemptRecorder:
    """What the wrapped agent records of a failed attempt (trainer/attempts.py)."""
    recorder = supervisor.AttemptRecorder(run_dir)
    recorder.record(0, failures)
    return recorder


def test_the_error_names_the_root_cause_its_signal_and_the_consequences(tmp_path):
    run_dir = RunDir.create(root=tmp_path)
    abort = ProcessFailure(1, 9, -6, "/nonexistent")
    peer = ProcessFailure(0, 8, 1, "/nonexistent")
    recorder = _recorded(run_dir, {1: abort, 0: peer})
    error = error_of(ChildFailedError("bootstrap", {1: abort, 0: peer}), run_dir, recorder)
    assert (error["rank"], error["kind"], error["signal"], error["pid"]) == (1, "signal",
                                                                             "SIGABRT", 9)
    assert error["message"] == "killed by SIGABRT (signal 6)"
    assert [(c["rank"], c["kind"]) for c in error["consequences"]] == [(0, "exit")]


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
    monkeypatch.setenv(SUPERVISED_ENV, "")

    def torchrun(_args):
        starts.append(read_json(run_dir.job_file)["nproc"])
        if len(starts) == 1:  # rank 0 left a record, then rank 1 aborted at teardown
            atomic_write_json(run_dir.path / RECORD, {"from": 2, "to": 1, "step": 7})
            _aborted()

    monkeypatch.setattr(supervisor, "torchrun", torchrun)
    assert supervisor.main(str(run_dir.path)) == 0
    assert starts == [2, 1]  # started again with the new size
    [warning] = [e for e in read_records(run_dir.events_log) if e["kind"] == "warning"]
    assert "rank 1 died after leaving for a resize: killed by SIGABRT" in warning["message"]
    assert read_json(run_dir.state_file)["state"] == "finished"
    assert '"to": 1' in os.environ[RESIZED_ENV]


def test_a_stale_resize_record_never_turns_a_failure_into_a_resize(tmp_path, monkeypatch):
    """A record from before this supervisor (a resize whose end failed, then resume=)."""
    run_dir = _job(tmp_path)
    atomic_write_json(run_dir.path / RECORD, {"from": 2, "to": 1, "step": 7})
    monkeypatch.setenv(RESIZED_ENV, "")  # were it taken for a resize (see above)
    monkeypatch.setenv(SUPERVISED_ENV, "")
    starts = []
    monkeypatch.setattr(supervisor, "torchrun", lambda args: starts.append(1) or _aborted())
    assert supervisor.main(str(run_dir.path)) == 1
    assert len(starts) == 1  # not started again as if resized
    assert not [e for e in read_records(run_dir.events_log) if e["kind"] == "warning"]
    state = read_json(run_dir.state_file)
    assert state["state"] == "failed" and state["error"]["exitcode"] == -6
    assert not (run_dir.path / RECORD).exists()
