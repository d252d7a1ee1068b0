"""Real ZeroMQ sockets on loopback: request/reply, errors, timeouts, retries."""

import threading

import pytest
import zmq

from hpinteract.protocol.errors import HpiTimeout, InvalidHParam
from hpinteract.transport.control import ControlClient, ControlServer, Rejected

KEY = b"s" * 32


def serve(server: ControlServer, n: int, seen: list, drop_first: bool = False):
    def loop():
        dropped = False
        for _ in range(n):
            try:
                ident, msg = server.recv()
            except Rejected as exc:
                seen.append(("rejected", str(exc)))
                continue
            seen.append((msg.type, msg.header.req_id))
            if drop_first and not dropped:
                dropped = True  # pretend the reply got lost: the client must retry
                continue
            if msg.type == "bad":
                server.reply(ident, msg, {"ok": False, "error": InvalidHParam(
                    "lr is wrong", field="lr").to_wire()})
            else:
                server.reply(ident, msg, {"ok": True, "echo": msg.content})
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


@pytest.fixture
def server():
    s = ControlServer(zmq.Context.instance(), KEY)
    yield s
    s.close()


def test_request_reply_on_loopback(server):
    seen: list = []
    t = serve(server, 1, seen)
    c = ControlClient(zmq.Context.instance(), f"tcp://127.0.0.1:{server.port}", KEY)
    assert c.request("get", {"a": 1})["echo"] == {"a": 1}
    t.join(5)
    c.close()


def test_the_servers_typed_error_is_raised_in_the_client(server):
    serve(server, 1, [])
    c = ControlClient(zmq.Context.instance(), f"tcp://127.0.0.1:{server.port}", KEY)
    with pytest.raises(InvalidHParam, match="lr is wrong") as exc:
        c.request("bad")
    assert exc.value.field == "lr"
    c.close()


def test_a_lost_reply_is_retried_with_the_same_request_id(server):
    seen: list = []
    serve(server, 2, seen, drop_first=True)
    c = ControlClient(zmq.Context.instance(), f"tcp://127.0.0.1:{server.port}", KEY,
                      timeout_s=0.3, retries=2)
    assert c.request("get")["ok"]
    assert seen[0][1] == seen[1][1]  # same req_id: the server can tell it is a retry
    c.close()


def test_no_server_means_a_timeout_after_bounded_retries():
    c = ControlClient(zmq.Context.instance(), "tcp://127.0.0.1:9", KEY, timeout_s=0.1,
                      retries=1)
    with pytest.raises(HpiTimeout, match="after 2 tries"):
        c.request("get")


def test_client_with_the_wrong_key_is_rejected(server):
    seen: list = []
    t = serve(server, 1, seen)
    c = ControlClient(zmq.Context.instance(), f"tcp://127.0.0.1:{server.port}", b"w" * 32,
                      timeout_s=0.3, retries=0)
    with pytest.raises(HpiTimeout):  # the reply is signed with the real key: dropped too
        c.request("get")
    t.join(5)
    assert seen[0][0] == "rejected"
    c.close()
