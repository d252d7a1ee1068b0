"""Fuzzing the control socket of a live 2-rank job with more than 10,000 hostile messages.

Malformed frames and JSON, missing, wrong and forged signatures, tampered content, replayed
ids, stale and future timestamps, other protocol versions, oversized payloads, wrong types,
NaN/inf/negative/out-of-range values, unknown names and request types, commands in the
wrong state, bad policy requests, all sent as a flood from several sockets at once.

What must hold: every message that passes the signature check gets a rejection that names
what is wrong; the unsigned, forged, malformed, replayed and stale ones are refused (with
an answer that says why, or, for a flood beyond the job's rate limit, dropped) and each is
written to rank 0's log; nothing is applied; the coordinator keeps answering; and the job's
loss at every step is that of an undisturbed run with the same seed.

The job is a seeded script of this file's own (the toy's model start is random). It holds
before ``run.finish()`` until the test releases it, so that the fuzzing never outlasts the
training loop, however slow the machine: no timing decides anything here. Every wait on a
reply is ordered, not timed: after a burst, each socket sends a legitimate ``status`` and
reads replies until that one's answer, which the coordinator sends after those of every
message that socket sent before it.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import zmq
from helpers import wait_for_step
from zmq.utils.monitor import recv_monitor_message

import hpinteract as hpi
from hpinteract.client.history import read_records
from hpinteract.protocol.codec import DELIM, MAX_MESSAGE_BYTES, Codec
from hpinteract.protocol.connection import ConnectionInfo
from hpinteract.protocol.messages import PROTOCOL_VERSION, Header, make_message, new_id

SCRIPT = '''
import argparse, os, time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpinteract as hpi

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=1024)
p.add_argument("--epochs", type=int, default=8)
p.add_argument("--gate", default="")
a = p.parse_args()

run = hpi.init(
    hparams={"lr": 0.05, "momentum": 0.0, "batch_size": 16, "sleep": 0.003},
    specs={
        "dropout": hpi.HParam(0.1, low=0.0, high=0.9),
        "mode": hpi.HParam("a", choices=("a", "b")),
        "note": hpi.HParam(""),
    },
)


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


torch.manual_seed(0)  # the model's start and the dropout masks: the same in every run
model = DDP(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.watch(model, opt)
loader = run.dataloader(Data(a.n), seed=1)
for epoch in run.epochs(a.epochs):
    for x, y in loader:
        opt.zero_grad()
        # every hyper-parameter the fuzzer targets shows in the loss if it ever applies
        h = nn.functional.dropout(x, p=run.hp["dropout"])
        scale = 2.0 if run.hp["mode"] == "b" else 1.0
        loss = scale * nn.functional.cross_entropy(model(h), y) + 0.0 * len(run.hp["note"])
        loss.backward()
        opt.step()
        time.sleep(run.hp["sleep"])
        run.step(loss=loss)
while a.gate and not os.path.exists(a.gate):  # the test releases the fuzzed job
    time.sleep(0.01)
run.finish()
'''
ARGS = ["--n", "1024", "--epochs", "8"]  # 64 steps an epoch, 512 steps
HANG_GUARD_MS = 120_000  # only against a wedged coordinator: nothing waits this long
ROUND = 2000  # messages sent back to back before the sockets sync (below ROUTER's HWM each)
SOCKETS = 4
INF, NAN = float("inf"), float("nan")
BIG = 10**400  # an integer no float can hold

# ---- what the fuzzer sends, and what it expects back ------------------------------------


@dataclass(frozen=True)
class Expect:
    """A rejection: error type, the field named (or None) and words of the message."""

    type: str
    field: str | None
    words: str


def _bad(field: str | None, words: str) -> Expect:
    return Expect("InvalidHParam", field, words)


# set {"values": ...}: the job's hyper-parameters are lr, momentum, batch_size, sleep,
# dropout [0, 0.9], mode in (a, b), note (str) and the built-ins (weight_decay, ...).
BAD_VALUES: list[tuple[dict[str, Any], Expect]] = [
    ({"lr": NAN}, _bad("lr", "not a finite number")),
    ({"lr": INF}, _bad("lr", "not a finite number")),
    ({"lr": -INF}, _bad("lr", "not a finite number")),
    ({"lr": -0.1}, _bad("lr", "below the minimum")),
    ({"lr": -1e-300}, _bad("lr", "below the minimum")),
    ({"lr": "0.1"}, _bad("lr", "must be float")),
    ({"lr": [0.1]}, _bad("lr", "must be float")),
    ({"lr": {"v": 0.1}}, _bad("lr", "must be float")),
    ({"lr": None}, _bad("lr", "must be float")),
    ({"lr": True}, _bad("lr", "must be float")),
    ({"momentum": 2.0}, _bad("momentum", "above the maximum")),
    ({"momentum": -1}, _bad("momentum", "below the minimum")),
    ({"momentum": NAN}, _bad("momentum", "not a finite number")),
    ({"dropout": 1.5}, _bad("dropout", "above the maximum")),
    ({"dropout": -0.01}, _bad("dropout", "below the minimum")),
    ({"dropout": 10**30}, _bad("dropout", "above the maximum")),
    ({"dropout": "high"}, _bad("dropout", "must be float")),
    ({"dropout": INF}, _bad("dropout", "not a finite number")),
    ({"mode": "c"}, _bad("mode", "not one of the allowed values")),
    ({"mode": "A"}, _bad("mode", "not one of the allowed values")),
    ({"mode": 1}, _bad("mode", "must be str")),
    ({"mode": None}, _bad("mode", "must be str")),
    ({"mode": ["a"]}, _bad("mode", "must be str")),
    ({"note": 5}, _bad("note", "must be str")),
    ({"note": {"a": 1}}, _bad("note", "must be str")),
    ({"batch_size": 0}, _bad("batch_size", "below the minimum")),
    ({"batch_size": -16}, _bad("batch_size", "below the minimum")),
    ({"batch_size": -(10**30)}, _bad("batch_size", "below the minimum")),
    ({"batch_size": 15}, _bad("batch_size", "cannot be shared by 2 ranks")),
    ({"batch_size": 10**30 + 1}, _bad("batch_size", "cannot be shared by 2 ranks")),
    ({"batch_size": 16.5}, _bad("batch_size", "must be int")),
    ({"batch_size": "32"}, _bad("batch_size", "must be int")),
    ({"batch_size": NAN}, _bad("batch_size", "must be int")),
    ({"batch_size": INF}, _bad("batch_size", "must be int")),
    ({"batch_size": True}, _bad("batch_size", "must be int")),
    ({"weight_decay": -1.0}, _bad("weight_decay", "below the minimum")),
    ({"checkpoint_every": -5}, _bad("checkpoint_every", "below the minimum")),
    ({"monitor_gns": "on"}, _bad("monitor_gns", "must be int")),
    ({"monitor_ranks": -1}, _bad("monitor_ranks", "below the minimum")),
    ({"gns_smoothing": 1.0}, _bad("gns_smoothing", "above the maximum")),
    ({"lr_scaling": "cubic"}, _bad("lr_scaling", "not one of the allowed values")),
    ({"sleep": "0"}, _bad("sleep", "must be float")),
    ({"sleep": NAN}, _bad("sleep", "not a finite number")),
    ({"nope": 1}, _bad("nope", "unknown hyper-parameter 'nope'")),
    ({"": 0.1}, _bad("", "unknown hyper-parameter ''")),
    ({"LR": 0.1}, _bad("LR", "unknown hyper-parameter 'LR'")),
    ({"lr ": 0.1}, _bad("lr ", "unknown hyper-parameter 'lr '")),
    ({"__class__": 1}, _bad("__class__", "unknown hyper-parameter")),
    ({"micro_batch": 4}, _bad("micro_batch", "unknown hyper-parameter")),  # not declared
    # a valid value next to a bad one: the whole set is rejected, neither applies
    ({"lr": 0.01, "nope": 2}, _bad("nope", "unknown hyper-parameter")),
    ({"lr": 0.01, "dropout": 7}, _bad("dropout", "above the maximum")),
    ({"lr": 0.001, "batch_size": 33}, _bad("batch_size", "cannot be shared")),
    ({"mode": "b", "momentum": 1.5}, _bad("momentum", "above the maximum")),
    ({}, _bad(None, "no hyper-parameter values")),
]
NEEDS_VALUES = Expect("InvalidCommand", None, "set needs a 'values' object")
BAD_SET_CONTENT: list[tuple[dict[str, Any], Expect]] = [
    ({"values": "lr=0.1"}, NEEDS_VALUES),
    ({"values": [["lr", 0.1]]}, NEEDS_VALUES),
    ({"values": None}, NEEDS_VALUES),
    ({"values": 0.1}, NEEDS_VALUES),
    ({}, NEEDS_VALUES),
    ({"lr": 0.1}, NEEDS_VALUES),
    ({"values": {"lr": -1}, "source": {"evil": 1}, "reason": ["x"]},
     _bad("lr", "below the minimum")),
]
UNKNOWN_TYPES = ["exec", "eval", "pickle", "", "SET", "set ", "stop\x00", "__init__",
                 "reply", "pause!", "resume\n", "checkpointx", "../set", "\u03a9", "x" * 1000]
POLICY = "InvalidCommand"
BAD_REQUESTS: list[tuple[str, dict[str, Any], Expect]] = [
    ("resume", {"source": "fuzz"},
     Expect("InvalidState", None, "cannot resume a job that is running")),
    ("resume", {}, Expect("InvalidState", None, "cannot resume a job that is running")),
    ("resume", {"values": {"lr": 0.5}},
     Expect("InvalidState", None, "cannot resume a job that is running")),
    ("add_policy", {"name": "rm -rf /"}, Expect(POLICY, None, "unknown policy")),
    ("add_policy", {"name": 3}, Expect(POLICY, None, "needs a policy 'name'")),
    ("add_policy", {}, Expect(POLICY, None, "needs a policy 'name'")),
    ("add_policy", {"name": "warmup", "params": "steps=5"},
     Expect(POLICY, None, "'params' must be an object")),
    ("add_policy", {"name": "warmup", "params": {"steps": -5}},
     Expect(POLICY, None, "steps must be an integer >= 1")),
    ("add_policy", {"name": "warmup", "params": {"steps": NAN}},
     Expect(POLICY, None, "steps must be an integer >= 1")),
    ("add_policy", {"name": "warmup", "params": {"steps": 5, "evil": 1}},
     Expect(POLICY, "evil", "unknown parameter evil")),
    ("add_policy", {"name": "adaptive_batch", "params": {}},
     Expect(POLICY, "max_batch", "missing required parameter max_batch")),
    ("add_policy", {"name": "reduce_on_plateau", "params": {"factor": NAN}},
     Expect(POLICY, None, "factor must be a finite number")),
    ("add_policy", {"name": "divergence_guard", "params": {"lr_factor": INF}},
     Expect(POLICY, None, "lr_factor must be a finite number")),
    ("add_policy", {"name": "schedule", "params": {"kind": "evil"}},
     Expect(POLICY, None, "kind must be one of")),
    # valid policies, invalid 'every': nothing may be added
    ("add_policy", {"name": "warmup", "params": {"steps": 5}, "every": 0},
     Expect(POLICY, None, "every must be a positive integer")),
    ("add_policy", {"name": "warmup", "params": {"steps": 5}, "every": -1},
     Expect(POLICY, None, "every must be a positive integer")),
    ("add_policy", {"name": "warmup", "params": {"steps": 5}, "every": "x"},
     Expect(POLICY, None, "every must be a positive integer")),
    ("add_policy", {"name": "warmup", "params": {"steps": 5}, "every": True},
     Expect(POLICY, None, "every must be a positive integer")),
    ("add_policy", {"name": "warmup", "params": {"steps": 5}, "every": 1.5},
     Expect(POLICY, None, "every must be a positive integer")),
    ("remove_policy", {"name": "nope"}, Expect(POLICY, None, "no policy named 'nope'")),
    ("remove_policy", {"name": ["x"]}, Expect(POLICY, None, "needs a policy 'name'")),
    ("enable_policy", {"name": "nope"}, Expect(POLICY, None, "no policy named 'nope'")),
    ("note", {"status": "applied"}, Expect(POLICY, None, "a note's status must be one of")),
    ("note", {}, Expect(POLICY, None, "a note's status must be one of")),
    ("note", {"status": "decided", "policy": 5},
     Expect(POLICY, None, "a note's 'policy' must be a string")),
    ("history", {"since": "x"}, Expect(POLICY, None, "'since' must be an integer")),
    ("history", {"since": True}, Expect(POLICY, None, "'since' must be an integer")),
    ("history", {"limit": 1.5}, Expect(POLICY, None, "'limit' must be an integer")),
]
# A bug this test found, since fixed (test_huge_integers_get_a_clear_rejection): a float
# hyper-parameter (or a policy's float parameter) given an int too large for a float raised
# OverflowError in HParam._coerce (protocol/hparams.py, math.isfinite) or the policy's
# constructor, which the coordinator did not turn into a rejection: no answer, no
# "rejected" event, only a traceback.
HUGE_INTS: list[tuple[str, dict[str, Any], Expect]] = [
    ("set", {"values": {"lr": BIG}}, _bad("lr", "is not a finite number")),
    ("set", {"values": {"momentum": -BIG}}, _bad("momentum", "is not a finite number")),
    ("set", {"values": {"dropout": BIG}}, _bad("dropout", "is not a finite number")),
    ("set", {"values": {"gns_smoothing": BIG}},
     _bad("gns_smoothing", "is not a finite number")),
    ("add_policy", {"name": "reduce_on_plateau", "params": {"factor": BIG}},
     Expect(POLICY, None, "factor must be a finite number")),
]
# A bug this test found, since fixed (test_deeply_nested_json_is_rejected): signed JSON
# nested deeper than the interpreter's recursion limit made json.loads raise RecursionError,
# which Codec.unpack (protocol/codec.py) did not catch: no rejection, no log line but a
# traceback.
DEEP = b"[" * 100_000 + b"]" * 100_000

# Reasons of rejections on the codec's path (AuthError, ProtocolError), as the job words
# them in its replies, its security events and its log.
UNSIGNED = "unsigned message (no signature delimiter)"
MALFORMED_SIGNED = "malformed signed message"
BAD_SIG = "bad signature"
MALFORMED = "malformed message:"
NOT_OBJECT = "message content must be a JSON object"
VERSION = "is not compatible with"
STALE = "stale message"
REPLAYED = "replayed message"
TOO_LARGE = "message too large"
LOG_LINE = "rejected a control message: "


class Fuzzer:
    def __init__(self, info: ConnectionInfo, seed: int = 20_000) -> None:
        self.codec = Codec(info.key_bytes)
        self.rng = random.Random(seed)
        self.session = new_id()

    def header(self, type_: str, *, age: float = 0.0, version: str = PROTOCOL_VERSION,
               req_id: str | None = None, when: float | None = None) -> bytes:
        h = Header(new_id(), type_, self.session, time.time() - age if when is None else when,
                   version, req_id or new_id())
        return json.dumps(h.to_dict()).encode()

    def signed(self, type_: str, content: Any, **header: Any) -> list[bytes]:
        """Signed with the job's key: ``content`` is any JSON (NaN and inf included)."""
        h = self.header(type_, **header)
        c = content if isinstance(content, bytes) else json.dumps(content).encode()
        return [DELIM, self.codec.sign([h, c]), h, c]

    def request(self, type_: str, content: Any, **header: Any) -> tuple[list[bytes], str]:
        req_id = new_id()
        return self.signed(type_, content, req_id=req_id, **header), req_id

    def forged(self, type_: str, content: dict[str, Any]) -> list[bytes]:
        key = self.rng.choice([self.rng.randbytes(32), self.codec._key[:-1] + b"x",
                               self.codec._key + b"x", self.codec._key[::-1]])
        return Codec(key).pack(make_message(type_, content, session=self.session,
                                            req_id=new_id()))

    def garbage(self) -> tuple[list[bytes], str]:
        r = self.rng
        kind = r.randrange(6)
        if kind == 0:
            return [r.randbytes(r.randint(0, 64)) for _ in range(r.randint(1, 6))], UNSIGNED
        if kind == 1:
            return [r.choice([b"", b"{}", b"[]", b"null", b"\x00" * 8, b"set"])], UNSIGNED
        if kind == 2:  # the delimiter with too few or too many frames after it
            n = r.choice([0, 1, 2, 4, 5, 9])
            return [DELIM, *(r.randbytes(r.randint(0, 40)) for _ in range(n))], MALFORMED_SIGNED
        if kind == 3:  # the delimiter in a frame of its own, with junk around
            return [r.randbytes(8), DELIM + b"x", b"{}", b"{}"], UNSIGNED
        if kind == 4:  # routing junk, then a delimiter and unsigned frames
            return [r.randbytes(5), DELIM, b"", b"{}", b"{}"], BAD_SIG
        return [b"{}", b'{"values": {"lr": 0.5}}'], UNSIGNED

    def bad_signature(self) -> list[bytes]:
        r = self.rng
        legit = r.choice([("set", {"values": {"lr": 0.5}}), ("stop", {}), ("pause", {}),
                          ("set", {"values": {"mode": "b"}}), ("checkpoint", {})])
        kind = r.randrange(5)
        if kind == 0:  # another key
            return self.forged(*legit)
        frames = self.codec.pack(make_message(*legit, session=self.session, req_id=new_id()))
        if kind == 1:
            frames[1] = r.choice([b"", b"0" * 64, b"zz", frames[1][:-1], frames[1] + b"0"])
        elif kind == 2:
            frames[1] = frames[1].upper()  # the right digest, but not its hex spelling
        elif kind == 3:  # signed, then the content swapped
            frames[-1] = json.dumps({"values": {"lr": r.random()}}).encode()
        else:  # signed, then the header swapped (another type)
            frames[2] = frames[2].replace(b'"' + legit[0].encode() + b'"', b'"resume"')
        return frames

    def malformed_json(self) -> tuple[list[bytes], str | None]:
        """Signed, not valid; and the req_id, where the header is a JSON object that has
        one (the job may answer with it)."""
        r = self.rng
        req_id = new_id()
        good_h = self.header("set", req_id=req_id)
        readable = [good_h.replace(b'"time":', b'"time":"now",  "x":'),
                    good_h.replace(b'"type":', b'"typ":')]
        header = r.choice([b"{not json", b"[]", b'"header"', b"null", b"1", b"",
                           b'{"msg_id": 1}', r.randbytes(20), b"\xff\xfe", good_h[:-1],
                           *readable])
        body = r.choice([b"{", b'{"values": {"lr": 0.1}}', b"\xff\xfe", b"",
                         b'{"values": {"lr": 0.1}', b"{'values': 1}"])
        frames = [DELIM, self.codec.sign([header, body]), header, body]
        return frames, req_id if header in readable else None


@dataclass
class Unit:
    """Frames sent back to back on one socket. ``expect``: the req_ids that must be answered,
    with their rejection; ``maybe``: those that may be answered (signed messages the codec
    refuses: the job may answer them, by req_id where it can read one), and how;
    ``codec_reasons``: why the codec refuses the unit's messages, each logged."""

    category: str
    frames: list[list[bytes]]
    expect: dict[str, Expect] = field(default_factory=dict)
    maybe: dict[str, Expect] = field(default_factory=dict)
    codec_reasons: list[str] = field(default_factory=list)


def flood(f: Fuzzer) -> list[Unit]:
    r, units = f.rng, []

    def add(category: str, frames: list[list[bytes]], expect: dict[str, Expect] | None = None,
            maybe: dict[str, Expect] | None = None, reasons: list[str] | None = None) -> None:
        units.append(Unit(category, frames, expect or {}, maybe or {}, reasons or []))

    for _ in range(2000):
        frames, reason = f.garbage()
        add("garbage frames", [frames], reasons=[reason])
    for _ in range(1500):
        add("bad signature", [f.bad_signature()], reasons=[BAD_SIG])
    for _ in range(800):
        frames, readable = f.malformed_json()
        maybe = {readable: Expect("ProtocolError", None, MALFORMED)} if readable else {}
        add("malformed JSON", [frames], maybe=maybe, reasons=[MALFORMED])
    for _ in range(300):
        frames, req_id = f.request(
            "set", r.choice([[1], "x", 3, None, True, [{"values": {"lr": 0.1}}]]))
        add("content not an object", [frames],
            maybe={req_id: Expect("ProtocolError", None, NOT_OBJECT)}, reasons=[NOT_OBJECT])
    for _ in range(200):
        frames, req_id = f.request("set", {"values": {"lr": 0.1}},
                                   version=r.choice(["0.1", "2.0", "", "x", "99.0", "0"]))
        add("other protocol version", [frames],
            maybe={req_id: Expect("ProtocolError", None, VERSION)}, reasons=[VERSION])
    for _ in range(400):  # far outside the 300 s window, however long the flood takes
        frames, req_id = f.request(
            "set", {"values": {"lr": 0.1}},
            age=r.choice([3600.0, 86_400.0, 1e9, -3600.0, -86_400.0, INF, -INF]))
        add("stale or future time", [frames],
            maybe={req_id: Expect("AuthError", None, STALE)}, reasons=[STALE])
    for i in range(500):  # a message and its exact copy: the copy must be refused
        values, exp = BAD_VALUES[i % len(BAD_VALUES)]
        frames, req_id = f.request("set", {"values": values, "source": "fuzz"})
        add("replayed", [frames, list(frames)], {req_id: exp},
            {req_id: Expect("AuthError", None, REPLAYED)}, [REPLAYED])
    for i in range(2500):
        values, exp = BAD_VALUES[i % len(BAD_VALUES)]
        frames, req_id = f.request("set", {"values": values, "source": "fuzz"})
        add("bad value", [frames], {req_id: exp})
    for i in range(400):
        content, exp = BAD_SET_CONTENT[i % len(BAD_SET_CONTENT)]
        frames, req_id = f.request("set", content)
        add("bad set content", [frames], {req_id: exp})
    for i in range(800):
        type_ = UNKNOWN_TYPES[i % len(UNKNOWN_TYPES)]
        frames, req_id = f.request(type_, {"values": {"lr": 0.5}})
        add("unknown request type", [frames],
            {req_id: Expect("InvalidCommand", None, "unknown request type")})
    for i in range(900):
        type_, content, exp = BAD_REQUESTS[i % len(BAD_REQUESTS)]
        frames, req_id = f.request(type_, content)
        category = "wrong state" if type_ == "resume" else "bad policy/note/history"
        add(category, [frames], {req_id: exp})
    for lr in ("x" * 2_000_000, ["y"] * 300_000):  # large, but under the size limit
        frames, req_id = f.request("set", {"values": {"lr": lr}})
        add("large payload", [frames], {req_id: _bad("lr", "must be float")})
    frames, req_id = f.request("set", {"values": {"n" * 1_000_000: 1}})
    add("large payload", [frames], {req_id: _bad("n" * 1_000_000, "unknown hyper-parameter")})
    frames, req_id = f.request("exec", {"blob": "z" * 4_000_000})
    add("large payload", [frames], {req_id: Expect("InvalidCommand", None, "unknown request")})
    r.shuffle(units)
    return units


# ---- the wire ------------------------------------------------------------------------------


class Line:
    """A DEALER on the job's control socket. ``sync`` returns every reply to what was sent
    before it: it sends a legitimate ``status`` and reads until that request's answer."""

    def __init__(self, info: ConnectionInfo, reader: Codec) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        for opt, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 0), (zmq.RCVHWM, 0)):
            self.sock.setsockopt(opt, value)
        self.sock.connect(info.control_url)
        self.codec = Codec(info.key_bytes)
        self.reader = reader
        self.status: dict[str, Any] = {}

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def sync(self) -> list[dict[str, Any]]:
        marker = new_id()
        self.send(self.codec.pack(make_message("status", {}, session="fuzz", req_id=marker)))
        got = []
        while True:
            if not self.sock.poll(HANG_GUARD_MS):
                raise AssertionError("the coordinator stopped answering")
            _, msg = self.reader.unpack(self.sock.recv_multipart())
            if msg.header.req_id == marker:
                assert msg.content.get("ok") is True, msg.content
                self.status = msg.content
                return got
            got.append({**msg.content, "req_id": msg.header.req_id})

    def close(self) -> None:
        self.sock.close()


def dropped_by_zeromq(info: ConnectionInfo, size: int) -> bool:
    """One frame bigger than the job takes, on a socket of its own: True once the job has
    hung up on it (ZeroMQ drops such a peer before any byte reaches hpinteract)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    try:
        sock.connect(info.control_url)
        sock.send_multipart([DELIM, b"0" * 64, b"{}", b" " * size])
        events: list[int] = []
        while zmq.EVENT_DISCONNECTED not in events:
            if not monitor.poll(HANG_GUARD_MS):
                return False
            events.append(recv_monitor_message(monitor)["event"])
        return True
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


# ---- the run ---------------------------------------------------------------------------------


def probes(f: Fuzzer) -> list[tuple[str, list[list[bytes]], list[Expect]]]:
    """Phase 1, one at a time (within the job's 30 answered rejections a minute): each
    kind of codec rejection, the replay pair, and the bugs it once found, with their exact
    answer."""
    key = f.codec
    set_bad = {"values": {"lr": -1.0}}
    legit = key.pack(make_message("set", {"values": {"lr": 0.5}}, session="p", req_id=new_id()))
    tampered = list(legit)
    tampered[-1] = b'{"values": {"lr": 0.9}}'
    unsigned = list(legit)
    unsigned[1] = b""
    original, _ = f.request("set", set_bad)
    half = MAX_MESSAGE_BYTES // 2 + 1
    big_h = f.header("set")
    big_h = big_h[:-1] + b',"pad":"' + b"p" * (half - len(big_h) - 9) + b'"}'
    big_c = b'{"values":{"lr":0.1},"pad":"' + b"q" * (half - 30) + b'"}'
    auth, proto = "AuthError", "ProtocolError"
    return [
        ("no delimiter", [[b"hello"]], [Expect(auth, None, UNSIGNED)]),
        ("delimiter, one frame", [[DELIM, b"sig"]], [Expect(auth, None, MALFORMED_SIGNED)]),
        ("another key, set", [f.forged("set", {"values": {"lr": 0.5}})],
         [Expect(auth, None, BAD_SIG)]),
        ("another key, stop", [f.forged("stop", {})], [Expect(auth, None, BAD_SIG)]),
        ("empty signature", [unsigned], [Expect(auth, None, BAD_SIG)]),
        ("tampered content", [tampered], [Expect(auth, None, BAD_SIG)]),
        ("header not JSON", [[DELIM, key.sign([b"{x", b"{}"]), b"{x", b"{}"]],
         [Expect(proto, None, MALFORMED)]),
        ("header without msg_id", [[DELIM, key.sign([b'{"type":"set"}', b"{}"]),
                                    b'{"type":"set"}', b"{}"]],
         [Expect(proto, None, MALFORMED)]),
        ("content a list", [f.signed("set", [1])], [Expect(proto, None, NOT_OBJECT)]),
        ("protocol 0.1", [f.signed("set", set_bad, version="0.1")],
         [Expect(proto, None, VERSION)]),
        ("an hour old", [f.signed("set", set_bad, age=3600)], [Expect(auth, None, STALE)]),
        ("an hour ahead", [f.signed("set", set_bad, age=-3600)], [Expect(auth, None, STALE)]),
        ("replayed", [original, list(original)],
         [_bad("lr", "below the minimum"), Expect(auth, None, REPLAYED)]),
        ("two frames, together too large", [[DELIM, key.sign([big_h, big_c]), big_h, big_c]],
         [Expect(auth, None, TOO_LARGE)]),
        ("wrong state", [f.signed("resume", {"source": "fuzz"})],
         [Expect("InvalidState", None, "cannot resume a job that is running")]),
        # Was a bug (fixed): no answer (OverflowError), see HUGE_INTS
        ("huge int", [f.signed("set", {"values": {"lr": BIG}})],
         [_bad("lr", "is not a finite number")]),
        # Was a bug (fixed): no answer (RecursionError), see DEEP
        ("deep nesting", [f.signed("set", b'{"values":' + DEEP + b"}")],
         [Expect(proto, None, "malformed message: RecursionError")]),
        # Was a bug (fixed): a NaN time passes the codec's freshness check (abs(now - nan) >
        # window is False), so the message is taken as fresh (and a NaN first in the replay
        # memory stops its time-based pruning): it should be refused like a stale one.
        ("NaN time", [f.signed("set", set_bad, when=NAN)], [Expect(auth, None, STALE)]),
    ]


def check(reply: dict[str, Any] | None, exp: Expect) -> str | None:
    """None if ``reply`` is the rejection ``exp`` describes, else what is wrong with it."""
    if reply is None:
        return "no answer"
    err = reply.get("error")
    if reply.get("ok") is not False or not isinstance(err, dict):
        return f"not a rejection: {str(reply)[:300]}"
    message = str(err.get("message") or "")
    if err.get("type") != exp.type or not message or exp.words not in message or (
            exp.field is not None and err.get("field") != exp.field):
        return f"expected {exp}, got {err.get('type')} field={err.get('field')!r} " \
               f"{message[:300]!r}"
    return None


def barrage(job: hpi.Job, out: dict[str, Any]) -> None:
    info = ConnectionInfo.read(job.run_dir.connection)
    f = Fuzzer(info)
    reader = Codec(info.key_bytes)
    sent: Counter[str] = Counter()
    lines = [Line(info, reader) for _ in range(SOCKETS)]
    try:
        # Phase 1: one probe at a time, each answer checked exactly.
        probe_results: dict[str, list[str | None]] = {}
        codec_reasons: Counter[str] = Counter()
        for name, messages, expected in probes(f):
            for frames in messages:
                lines[0].send(frames)
            got = lines[0].sync()
            results = [check(got[i] if i < len(got) else None, exp)
                       for i, exp in enumerate(expected)]
            if len(got) > len(expected):
                results.append(f"{len(got) - len(expected)} answers too many: {got}")
            probe_results[name] = results
            out.setdefault("probe replies", {})[name] = got
            sent[f"probe: {name}"] += len(messages)
            codec_reasons.update(e.words for e in expected
                                 if e.type in ("AuthError", "ProtocolError")
                                 and name not in ("deep nesting", "NaN time"))
        out["probes"] = probe_results
        out["oversized frame dropped"] = dropped_by_zeromq(info, MAX_MESSAGE_BYTES + 1)
        sent["probe: one frame over the size limit"] += 1
        lines[0].sync()  # and the job still answers

        # Phase 2: the flood, in rounds of ROUND messages sent without waiting.
        units = flood(f)
        for unit in units:
            sent[unit.category] += len(unit.frames)
            codec_reasons.update(unit.codec_reasons)
        out["huge int expect"], out["deep nesting expect"] = {}, {}
        for _ in range(5):  # the bugs it once found, in the flood too
            for type_, content, exp in HUGE_INTS:
                frames, req_id = f.request(type_, content)
                units.insert(f.rng.randrange(len(units)), Unit("huge int (known bug)", [frames]))
                out["huge int expect"][req_id] = exp
                sent["huge int (known bug)"] += 1
            frames, req_id = f.request("set", b'{"values":' + DEEP + b"}")
            units.insert(f.rng.randrange(len(units)), Unit("deep nesting (known bug)", [frames]))
            out["deep nesting expect"][req_id] = Expect(
                "ProtocolError", None, "malformed message: RecursionError")
            sent["deep nesting (known bug)"] += 1
        expect = {k: v for u in units for k, v in u.expect.items()}
        maybe = {k: v for u in units for k, v in u.maybe.items()}
        replies: list[dict[str, Any]] = []
        out["step at flood start"] = lines[0].status["latest"]["step"]
        i = 0
        while i < len(units):
            n = 0
            while i < len(units) and n < ROUND:
                for frames in units[i].frames:
                    lines[i % SOCKETS].send(frames)
                n += len(units[i].frames)
                i += 1
            for line in lines:
                replies.extend(line.sync())
        out["step at flood end"] = lines[0].status["latest"]["step"]
        out["state at flood end"] = lines[0].status["state"]
        out["expect"], out["maybe"] = expect, maybe
        out["replies"] = replies
        out["codec reasons"] = codec_reasons
        out["sent"] = sent
    finally:
        for line in lines:
            line.close()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    where = tmp_path_factory.mktemp("fuzz")
    script, gate = where / "seeded.py", where / "release"
    script.write_text(SCRIPT)
    started = time.monotonic()
    # The undisturbed run trains alongside: losses do not depend on timing.
    reference = hpi.launch(script, nproc=2, args=ARGS)
    job = hpi.launch(script, nproc=2, args=[*ARGS, "--gate", str(gate)])
    out: dict[str, Any] = {}
    try:
        wait_for_step(job, 5)
        out["hparams before"] = job.hparams
        out["policies before"] = job.policies()
        barrage(job, out)
        out["status after"] = job.status()  # the client's own path, after the flood
        out["hparams after"] = job.hparams
        out["policies after"] = job.policies()
    finally:
        gate.touch()
        for j in (job, reference):
            with contextlib.suppress(Exception):
                j.wait(120)
            if not j.state.terminal:
                with contextlib.suppress(Exception):
                    j.stop()
                with contextlib.suppress(Exception):
                    j.wait(60)
    out["seconds"] = time.monotonic() - started
    out["final"] = (job.state.value, reference.state.value)
    out["losses"] = _losses(job)
    out["reference losses"] = _losses(reference)
    out["events"] = read_records(job.run_dir.events_log)
    out["log"] = job.logs(0)
    out["logs"] = job.logs()
    return out


def _losses(job: hpi.Job) -> list[tuple[int, float]]:
    df = job.metrics()
    return list(zip(df["step"].tolist(), df["loss"].tolist(), strict=True))


def _log_count(text: str, words: str) -> int:
    return sum(1 for line in text.splitlines() if LOG_LINE in line and words in line)


# ---- what must hold ----------------------------------------------------------------------------


def test_more_than_ten_thousand_hostile_messages_were_sent(fuzzed):
    sent = fuzzed["sent"]
    print(f"\nsent {sum(sent.values())} hostile messages in {fuzzed['seconds']:.0f}s "
          f"(the fuzzed job trained from step {fuzzed['step at flood start']} to "
          f"{fuzzed['step at flood end']} during the flood):")
    for category, n in sorted(sent.items()):
        print(f"  {n:6d}  {category}")
    assert sum(sent.values()) >= 10_000


def _answers(got: list[dict[str, Any]], need: Expect | None, opt: Expect | None) -> str | None:
    """What is wrong with the answers to one req_id: ``need`` must come (first), ``opt``
    may come."""
    wanted = [] if need is None else [need]
    if opt is not None and len(got) == len(wanted) + 1:
        wanted.append(opt)
    if len(got) != len(wanted):
        return f"{len(got)} answers, {len(wanted)} wanted"
    return next(filter(None, (check(r, e) for r, e in zip(got, wanted, strict=True))), None)


def test_every_verified_message_gets_a_rejection_that_names_what_is_wrong(fuzzed):
    by_id: dict[str | None, list[dict[str, Any]]] = {}
    for reply in fuzzed["replies"]:
        by_id.setdefault(reply["req_id"], []).append(reply)
    expect, maybe = fuzzed["expect"], fuzzed["maybe"]
    wrong: Counter[str] = Counter()
    for req_id in set(expect) | set(maybe):
        problem = _answers(by_id.get(req_id, []), expect.get(req_id), maybe.get(req_id))
        if problem:
            wrong[f"{expect.get(req_id) or maybe.get(req_id)}: {problem}"] += 1
    assert not wrong, wrong.most_common(10)
    known = {None, *expect, *maybe, *fuzzed["huge int expect"], *fuzzed["deep nesting expect"]}
    unexpected = set(by_id) - known
    assert not unexpected, [by_id[r] for r in list(unexpected)[:5]]


def test_forged_malformed_replayed_and_stale_messages_are_refused_with_a_reason(fuzzed):
    for name, results in fuzzed["probes"].items():
        if name in ("huge int", "deep nesting", "NaN time"):
            continue  # the bugs it once found have tests of their own
        assert results and all(r is None for r in results), (name, results)
    # In the flood, the codec's rejections are answered (the job's rate limit may drop
    # unsigned and forged ones, 30 a minute); what is answered says why.
    codec_replies = [r for r in fuzzed["replies"] if r["req_id"] is None]
    assert codec_replies  # some were answered in the flood too (the others by req_id)
    for reply in codec_replies:
        assert reply["ok"] is False and reply["error"]["type"] in ("AuthError",
                                                                   "ProtocolError"), reply
        assert reply["error"]["message"], reply


def test_no_hostile_message_is_accepted_and_nothing_applies(fuzzed):
    assert not [r for r in fuzzed["replies"] if r.get("ok") is not False]
    assert fuzzed["hparams after"] == fuzzed["hparams before"]
    assert fuzzed["policies after"] == fuzzed["policies before"]
    events = fuzzed["events"]
    changes = [e for e in events if e.get("kind") == "change"]
    assert not [e for e in changes if e.get("status") != "rejected"], changes[:5]
    assert not [e for e in events
                if e.get("kind") in ("rollback", "guard", "checkpoint", "policy")]
    states = [e["state"] for e in events if e.get("kind") == "state"]
    assert states == ["running", "finished"]  # never paused, stopped or resumed


def test_the_coordinator_keeps_answering(fuzzed):
    assert fuzzed["oversized frame dropped"]  # ZeroMQ hung up on that peer, not on others
    assert fuzzed["state at flood end"] == "running"
    after = fuzzed["status after"]
    assert after["state"] == "running" and after["job_id"]
    assert fuzzed["final"] == ("finished", "finished"), fuzzed["logs"][-3000:]


def test_every_refused_message_is_logged(fuzzed):
    # Rank 0's log has a line for each message the codec refused (answered or dropped);
    # the events log has the first ones as security events (the rest of a flood only
    # counted); every rejected set is an event of its own.
    log = fuzzed["log"]
    missing = {words: (n, _log_count(log, words))
               for words, n in fuzzed["codec reasons"].items() if _log_count(log, words) < n}
    assert not missing, missing
    security = [e for e in fuzzed["events"] if e.get("kind") == "security"]
    assert len(security) >= 14 and all(e.get("reason") for e in security)
    rejected_sets = [e for e in fuzzed["events"]
                     if e.get("kind") == "change" and e.get("status") == "rejected"]
    sets = sum(1 for u in fuzzed["expect"].values()
               if u.type == "InvalidHParam" or u is NEEDS_VALUES)
    assert len(rejected_sets) >= sets
    assert all(e.get("error") for e in rejected_sets)


def test_the_loss_at_every_step_is_that_of_an_undisturbed_run(fuzzed):
    ours, theirs = fuzzed["losses"], fuzzed["reference losses"]
    assert len(theirs) == 512 and [s for s, _ in theirs] == list(range(512))
    assert all(math.isfinite(v) for _, v in theirs)
    assert ours == theirs


# ---- bugs this test found, fixed: these keep them from coming back --------------------------


def test_huge_integers_get_a_clear_rejection(fuzzed):
    """Was a bug (fixed): ``set lr=10**400`` (or momentum, dropout, gns_smoothing; or a policy's
    float parameter) got no answer at all: OverflowError from math.isfinite in
    HParam._coerce (hpinteract/protocol/hparams.py) or the policy's check escaped
    RequestDesk._serve_one (hpinteract/trainer/requests.py), which mapped only ValueError,
    TypeError, KeyError and AttributeError to InvalidCommand; the cycle logged a traceback."""
    assert fuzzed["probes"]["huge int"] == [None]
    by_id = {r["req_id"]: r for r in fuzzed["replies"] if r["req_id"]}
    wrong = [(exp, check(by_id.get(req_id), exp))
             for req_id, exp in fuzzed["huge int expect"].items()
             if check(by_id.get(req_id), exp)]
    assert fuzzed["huge int expect"] and not wrong, wrong[:5]


def test_deeply_nested_json_is_rejected(fuzzed):
    """Was a bug (fixed): a signed message nested 100,000 deep got no answer and was not logged
    as rejected: json.loads raised RecursionError, which Codec.unpack
    (hpinteract/protocol/codec.py) did not catch; Coordinator._main logged a traceback."""
    _assert_refused(fuzzed["probe replies"]["deep nesting"])
    by_id = {r["req_id"]: r for r in fuzzed["replies"] if r["req_id"]}
    in_flood = fuzzed["deep nesting expect"]
    wrong = [(exp, check(by_id.get(req_id), exp)) for req_id, exp in in_flood.items()
             if check(by_id.get(req_id), exp)]
    assert len(in_flood) == 5 and not wrong, wrong[:5]


def _assert_refused(got: list[dict[str, Any]]) -> None:
    assert len(got) == 1, got or "no answer"
    err = got[0].get("error") or {}
    assert got[0].get("ok") is False and err.get("type") in ("AuthError", "ProtocolError"), got
    assert err.get("message"), got


def test_no_message_breaks_a_coordinator_cycle(fuzzed):
    """Fails with the two bugs above: each such message aborts a coordinator cycle."""
    log = fuzzed["log"]
    at = log.find("error in a cycle")
    assert at < 0, log[at : at + 1500]


def test_a_header_time_that_is_not_a_number_is_refused(fuzzed):
    """Was a bug (fixed): ``"time": NaN`` in a signed header passes Codec._check_replay
    (hpinteract/protocol/codec.py: abs(now - nan) > window is False): the message is taken
    as fresh whatever its age, and a NaN at the head of the replay memory stops its
    time-based pruning. It should be refused like a stale message."""
    _assert_refused(fuzzed["probe replies"]["NaN time"])
