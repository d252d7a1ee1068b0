"""The frames between rank 0 and its coordinator process (hpinteract/trainer/link.py), on
a real socket pair."""

from __future__ import annotations

import contextlib
import math
import socket

import pytest
import torch

from hpinteract.trainer.link import Reader, encode


def test_frames_split_and_joined_arrive_whole_and_in_order():
    a, b = socket.socketpair()
    first = encode([["metric", {"step": 1, "loss": 0.5}], ["state", "running", 1, "job"]])
    second = encode([["command", {"op": "set", "values": {"lr": 0.1}}]])
    reader = Reader(b)
    a.sendall(first[:3])  # not even a whole header
    assert reader.read() == []
    a.sendall(first[3:] + second[:5])
    assert reader.read() == [["metric", {"step": 1, "loss": 0.5}],
                             ["state", "running", 1, "job"]]
    a.sendall(second[5:])
    assert reader.read() == [["command", {"op": "set", "values": {"lr": 0.1}}]]
    a.close()
    assert reader.read() is None  # the other end closed


def test_a_large_frame_and_non_finite_losses_cross():
    a, b = socket.socketpair()
    changes = [{"id": str(i), "values": {"lr": i / 7}} for i in range(20000)]  # > one recv
    a.setblocking(False)
    data = encode([["extras", "c1", {"changes": changes}], ["metric", {"loss": math.nan}]])
    reader, items = Reader(b), []
    sent = 0
    while len(items) < 2:
        if sent < len(data):
            with contextlib.suppress(BlockingIOError):  # the reader makes room below
                sent += a.send(data[sent:])
        got = reader.read()
        assert got is not None
        items += got
    assert items[0][2]["changes"] == changes
    assert math.isnan(items[1][1]["loss"])


def test_scalars_are_read_and_anything_else_is_refused():
    a, b = socket.socketpair()
    a.sendall(encode([["metric", {"loss": torch.tensor(0.25)}]]))
    assert Reader(b).read() == [["metric", {"loss": 0.25}]]
    with pytest.raises(TypeError, match="cannot cross to the coordinator process"):
        encode([["metric", {"loss": object()}]])
