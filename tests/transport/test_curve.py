"""CURVE on real sockets: with the job's public key a client talks and listens; without
it (or with another key) the server answers nothing and publishes nothing to it."""

from __future__ import annotations

import threading

import pytest
import zmq

from hpinteract.protocol.errors import HpiTimeout
from hpinteract.transport.control import ControlClient, ControlServer
from hpinteract.transport.curve import ServerKeys, curve_wanted
from hpinteract.transport.pubsub import Publisher, Subscriber

KEY = b"c" * 32


def _serve_one(server: ControlServer) -> threading.Thread:
    def run() -> None:
        if server.socket.poll(5000):
            identity, msg = server.recv()
            server.reply(identity, msg, {"ok": True, "echo": msg.content})

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_only_a_client_with_the_servers_key_is_answered():
    ctx = zmq.Context.instance()
    keys = ServerKeys.new()
    server = ControlServer(ctx, KEY, curve=keys)
    url = f"tcp://127.0.0.1:{server.port}"
    t = _serve_one(server)
    plain = ControlClient(ctx, url, KEY, timeout_s=0.5, retries=0)
    with pytest.raises(HpiTimeout):  # no CURVE handshake: the server never sees a message
        plain.request("get", {"n": 1})
    wrong = ControlClient(ctx, url, KEY, timeout_s=0.5, retries=0,
                          server_key=ServerKeys.new().public)
    with pytest.raises(HpiTimeout):
        wrong.request("get", {"n": 2})
    right = ControlClient(ctx, url, KEY, server_key=keys.public)
    assert right.request("get", {"n": 3})["echo"] == {"n": 3}
    t.join(5)
    for c in (plain, wrong, right):
        c.close()
    server.close()


def test_published_records_reach_only_subscribers_with_the_key():
    ctx = zmq.Context.instance()
    keys = ServerKeys.new()
    pub = Publisher(ctx, KEY, curve=keys)
    url = f"tcp://127.0.0.1:{pub.port}"
    good = Subscriber(ctx, url, KEY, server_key=keys.public)
    plain = Subscriber(ctx, url, KEY)
    for i in range(50):  # until the subscription has reached the publisher
        pub.publish([{"seq": i}])
        if good.recv(0.1):
            break
    while good.recv(0.2):  # a late copy of the probes
        pass
    pub.publish([{"seq": 99, "loss": 0.5}])
    assert good.recv(1.0) == [{"seq": 99, "loss": 0.5}]  # the record, whole and once
    assert good.recv(0.2) is None
    assert plain.recv(0.3) is None  # without the server's key: nothing, ever
    for s in (good, plain, pub):
        s.close()


def test_curve_is_on_for_remote_addresses_and_when_asked(monkeypatch):
    monkeypatch.delenv("HPINTERACT_CURVE", raising=False)
    assert not curve_wanted("127.0.0.1") and not curve_wanted("::1")
    assert curve_wanted("10.1.2.3") and curve_wanted("0.0.0.0")
    monkeypatch.setenv("HPINTERACT_CURVE", "1")
    assert curve_wanted("127.0.0.1")
