import os
import stat

import pytest

from hpinteract.protocol.connection import ConnectionInfo, new_key
from hpinteract.protocol.errors import JobNotFound, ProtocolError
from hpinteract.protocol.rundir import RunDir, find_run_dir


def test_run_dirs_and_connection_files_are_owner_only(tmp_path):
    rd = RunDir.create("job-a", tmp_path)
    assert stat.S_IMODE(os.stat(rd.path).st_mode) == 0o700
    info = ConnectionInfo("job-a", "127.0.0.1", 5000, 5001, new_key(), os.getpid())
    info.write(rd.connection)
    assert stat.S_IMODE(os.stat(rd.connection).st_mode) == 0o600
    assert ConnectionInfo.read(rd.connection) == info


def test_a_world_readable_connection_file_is_refused(tmp_path):
    rd = RunDir.create("job-b", tmp_path)
    ConnectionInfo("job-b", "127.0.0.1", 1, 2, new_key(), 1).write(rd.connection)
    os.chmod(rd.connection, 0o644)
    with pytest.raises(ProtocolError, match="readable by others"):
        ConnectionInfo.read(rd.connection)


def test_find_by_id_prefix_latest_and_path(tmp_path):
    a = RunDir.create("20260101-000000-aaaaaa", tmp_path)
    b = RunDir.create("20260102-000000-bbbbbb", tmp_path)
    (a.job_file).write_text("{}")
    assert find_run_dir("latest", tmp_path).path == b.path
    assert find_run_dir("20260101", tmp_path).path == a.path
    assert find_run_dir(str(a.path), tmp_path).path == a.path
    with pytest.raises(JobNotFound, match="ambiguous"):
        find_run_dir("2026", tmp_path)
    with pytest.raises(JobNotFound):
        find_run_dir("nope", tmp_path)
