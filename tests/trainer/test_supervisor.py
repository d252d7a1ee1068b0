from types import SimpleNamespace as F

from hpinteract.trainer.supervisor import killed, root_cause


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


def test_a_job_is_killed_when_the_root_cause_died_by_a_signal():
    abort = F(message="Signal 6 (SIGABRT) received by PID 9", timestamp=1, exitcode=-6)
    peer = F(message="Connection closed by peer", timestamp=0, exitcode=1)
    assert killed({1: abort, 0: peer})
    assert not killed({1: F(message="ValueError: x", timestamp=0, exitcode=1), 0: abort})
