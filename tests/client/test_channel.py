"""Channel's sockets against a real ROUTER (ControlServer) on loopback: reused from a pool,
never shared by two requests at once, replaced when the job's coordinator moves; a query
holds up no other thread's and follows a coordinator that left."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import zmq

from hpinteract.client import channel as channel_mod
from hpinteract.client.channel import Channel
from hpinteract.protocol.connection import ConnectionInfo, new_key
from hpinteract.protocol.errors import InvalidHParam, JobFailed
from hpinteract.protocol.states import JobState
from hpinteract.transport.control import ControlServer


class Coordinator:
    """A ROUTER that answers every request, records the peer identity that sent it, and can
    hold its answers until told (commands wait for a step boundary)."""

    def __init__(self, ctx: zmq.Context[Any], run_dir: Path, silent: bool = False) -> None:
        key = new_key()
        self.server = ControlServer(ctx, key.encode())
        self.peers: list[bytes] = []
        self.types: list[str] = []
        self.silent = silent  # never answers (a coordinator that left for a restart)
        self.slow = threading.Event()  # set: "slow" queries wait until it is cleared
        self.hold = threading.Event()
        self.hold.set()
        self.held = threading.Semaphore(0)
        self._stop = threading.Event()
        ConnectionInfo(job_id="j", ip="127.0.0.1", control_port=self.server.port, pub_port=1,
                       key=key, pid=1).write(run_dir / "connection.json")
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        sock, pending = self.server.socket, []
        while not self._stop.is_set():
            if sock.poll(20):
                identity, msg = self.server.recv()
                self.peers.append(identity[0])
                self.types.append(msg.header.type)
                pending.append((identity, msg))
                self.held.release()
            if self.silent:
                pending.clear()
            if self.hold.is_set():
                for identity, msg in list(pending):
                    if msg.header.type == "slow" and self.slow.is_set():
                        continue
                    pending.remove((identity, msg))
                    if msg.content.get("values", {}).get("lr", 0) < 0:
                        err = {"type": "InvalidHParam", "message": "lr: must be >= 0"}
                        self.server.reply(identity, msg, {"ok": False, "error": err})
                    else:
                        self.server.reply(identity, msg, {"ok": True, "change_id": "c",
                                                          "applied_at_step": 1,
                                                          "port": self.server.port})

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.server.close()


@pytest.fixture()
def setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    ctx = zmq.Context()
    tmp_path.chmod(0o700)
    job = SimpleNamespace(id="j", run_dir=SimpleNamespace(connection=tmp_path / "connection.json"),
                          state=JobState.RUNNING, error=None)
    coords: list[Coordinator] = []

    def start(silent: bool = False) -> Coordinator:
        coords.append(Coordinator(ctx, tmp_path, silent))
        return coords[-1]

    ch = Channel(job)  # type: ignore[arg-type]
    ch.job_ns = job  # type: ignore[attr-defined]  # the tests change its state
    yield ch, start
    ch.close()
    for c in coords:
        c.close()
    ctx.term()


def test_commands_reuse_one_socket(setup) -> None:  # type: ignore[no-untyped-def]
    ch, start = setup
    coord = start()
    for _ in range(5):
        assert ch.request("set", {"values": {"lr": 0.1}}, command=True)["ok"]
    # One connection for all five: a socket per command would be five peers.
    assert len(coord.peers) == 5 and len(set(coord.peers)) == 1
    # An error answer leaves the socket fit for the next command.
    with pytest.raises(InvalidHParam, match="lr"):
        ch.request("set", {"values": {"lr": -1}}, command=True)
    assert ch.request("set", {"values": {"lr": 0.1}}, command=True)["ok"]
    assert len(set(coord.peers)) == 1


def test_concurrent_commands_get_their_own_sockets(setup) -> None:  # type: ignore[no-untyped-def]
    ch, start = setup
    coord = start()
    coord.hold.clear()  # answers wait, as at a step boundary
    n = 3
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: results.append(
        ch.request("set", {"values": {"lr": 0.1}}, command=True))) for _ in range(n)]
    for t in threads:
        t.start()
    for _ in range(n):
        assert coord.held.acquire(timeout=10)
    coord.hold.set()
    for t in threads:
        t.join(10)
    assert len(results) == n and len(set(coord.peers)) == n
    # All three went back to the pool and are used again, not opened anew.
    assert ch.request("set", {"values": {"lr": 0.1}}, command=True)["ok"]
    assert len(set(coord.peers)) == n


def test_pool_is_bounded(setup, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(channel_mod, "POOL_SIZE", 2)
    ch, start = setup
    coord = start()
    coord.hold.clear()
    threads = [threading.Thread(target=ch.request, args=("set", {"values": {"lr": 0.1}}, True))
               for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(4):
        assert coord.held.acquire(timeout=10)
    coord.hold.set()
    for t in threads:
        t.join(10)
    assert len(ch._idle) == 2


def test_a_moved_coordinator_gets_new_sockets(setup) -> None:  # type: ignore[no-untyped-def]
    ch, start = setup
    first = start()
    assert ch.request("set", {"values": {"lr": 0.1}}, command=True)["ok"]
    old = ch._idle[0][0]
    first.close()
    second = start()  # as a restarted job: another port, another key, a new connection file
    assert ch.request("set", {"values": {"lr": 0.1}}, command=True)["ok"]
    assert len(second.peers) == 1
    assert all(client is not old for client, _ in ch._idle)


def test_a_slow_query_holds_up_no_other_threads_query(setup) -> None:  # type: ignore[no-untyped-def]
    ch, start = setup
    coord = start()
    coord.slow.set()
    slow: list[dict[str, Any]] = []
    t = threading.Thread(target=lambda: slow.append(ch.request("slow")))
    t.start()
    assert coord.held.acquire(timeout=10)  # the slow query is at the coordinator
    assert ch.request("status")["ok"]  # answered while the other still waits
    assert not slow
    coord.slow.clear()
    t.join(10)
    assert slow and slow[0]["ok"]


def test_a_query_follows_a_coordinator_that_left_without_asking_it_again(
        setup) -> None:  # type: ignore[no-untyped-def]
    ch, start = setup
    gone = start(silent=True)
    result: list[dict[str, Any]] = []
    t = threading.Thread(target=lambda: result.append(ch.request("status")))
    t.start()
    assert gone.held.acquire(timeout=10)
    path = ch.job.run_dir.connection
    path.unlink()  # the coordinator left (a resize): the query waits for the next file
    new = start()
    t.join(30)
    assert result and result[0]["port"] == new.server.port
    assert gone.types == ["status"]  # asked once, not again and again
    assert new.types == ["status"]


def test_a_query_to_a_job_that_ends_meanwhile_raises(setup) -> None:  # type: ignore[no-untyped-def]
    ch, start = setup
    gone = start(silent=True)
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            ch.request("status")
        except JobFailed as exc:
            errors.append(exc)

    t = threading.Thread(target=ask)
    t.start()
    assert gone.held.acquire(timeout=10)
    ch.job_ns.state = JobState.FAILED
    t.join(30)
    assert len(errors) == 1 and gone.types == ["status"]
