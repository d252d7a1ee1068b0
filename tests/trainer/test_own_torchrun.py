"""The run directory under a user's own torchrun: a restarted rank 0 finds the one its
first attempt made, a new torchrun with the same --rdzv-id makes a new one
(tests/client/test_multinode.py restarts such a job for real)."""

from __future__ import annotations

from hpinteract.trainer import own_torchrun


def test_a_restart_in_the_same_agent_finds_the_first_attempts_directory(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("HPINTERACT_HOME", str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "exp/17")  # a name, as Slurm scripts reuse
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    first = own_torchrun.run_dir_for_rank0()
    own_torchrun.record_agent()
    assert own_torchrun.run_dir_for_rank0().path == first.path  # attempt 1, same agent
    assert (tmp_path / "torchrun" / "exp_17").stat().st_mode & 0o777 == 0o700

    # Another torchrun with the same id: another agent (here: another start time).
    monkeypatch.setattr(own_torchrun, "_agent_mark", lambda: "host-1-999")
    second = own_torchrun.run_dir_for_rank0()
    assert second.path != first.path
    own_torchrun.record_agent()
    assert own_torchrun.run_dir_for_rank0().path == second.path


def test_nothing_is_recorded_where_the_ranks_are_never_restarted(tmp_path, monkeypatch):
    monkeypatch.setenv("HPINTERACT_HOME", str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    a = own_torchrun.run_dir_for_rank0()
    own_torchrun.record_agent()
    assert own_torchrun.run_dir_for_rank0().path != a.path
    assert not (tmp_path / "torchrun").exists()
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")  # plain python: a job of its own each time
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    assert own_torchrun.run_dir_for_rank0().path != a.path
