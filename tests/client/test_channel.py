"""Channel's command sockets against a real ROUTER (ControlServer) on loopback: reused from
a pool, never shared by two commands at once, replaced when the job's coordinator moves."""

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
from hpinteract.protocol.errors import InvalidHParam
from hpinteract.protocol.states import JobState
from hpinteract.transport.control import ControlServer


class Coordinator:
    """A ROUTER that answers every request, records the peer identity that sent it, and can
    hold its answers until told (commands wait for a step boundary)."""

    def __init__(self, ctx: zmq.Context[Any], run_dir: Path) -> None:
        key = new_key()
        self.server = ControlServer(ctx, key.encode())
        self.peers: list[bytes] = []
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
                pending.append((identity, msg))
                self.held.release()
            if self.hold.is_set():
                for identity, msg in pending:
                    if msg.content.get("values", {}).get("lr", 0) < 0:
                        err = {"type": "InvalidHParam", "message": "lr: must be >= 0"}
                        self.server.reply(identity, msg, {"ok": False, "error": err})
                    else:
                        self.server.reply(identity, msg, {"ok": True, "change_id": "c",
                                                          "applied_at_step": 1})
                pending.clear()

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

    def start() -> Coordinator:
        coords.append(Coordinator(ctx, tmp_path))
        return coords[-1]

    ch = Channel(job)  # type: ignore[arg-type]
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
