import time

import pytest

from hpinteract.protocol.codec import DELIM, Codec
from hpinteract.protocol.errors import AuthError, ProtocolError
from hpinteract.protocol.messages import Header, Message, make_message

KEY = b"k" * 32


def test_round_trip_keeps_header_and_content():
    msg = make_message("set", {"values": {"lr": 0.1}}, session="s", req_id="r")
    _, got = Codec(KEY).unpack(Codec(KEY).pack(msg))
    assert got == msg


def test_routing_frames_before_the_delimiter_are_returned():
    frames = [b"identity", *Codec(KEY).pack(make_message("get", {}, session="s"))]
    prefix, _ = Codec(KEY).unpack(frames)
    assert prefix == [b"identity"]


@pytest.mark.parametrize("tamper", ["header", "content", "signature"])
def test_any_tampered_part_fails_verification(tamper):
    frames = Codec(KEY).pack(make_message("set", {"values": {"lr": 0.1}}, session="s"))
    i = {"signature": 1, "header": 2, "content": 3}[tamper]
    frames[i] = frames[i].replace(b"1", b"2") if tamper != "signature" else b"0" * 64
    with pytest.raises(AuthError, match="bad signature"):
        Codec(KEY).unpack(frames)


def test_wrong_key_and_unsigned_messages_are_rejected():
    frames = Codec(b"x" * 32).pack(make_message("get", {}, session="s"))
    with pytest.raises(AuthError, match="bad signature"):
        Codec(KEY).unpack(frames)
    with pytest.raises(AuthError, match="unsigned"):
        Codec(KEY).unpack([b"{}", b"{}"])


def test_signature_is_checked_before_decoding():
    c = Codec(KEY)
    frames = [DELIM, b"0" * 64, b"not json", b"{"]
    with pytest.raises(AuthError, match="bad signature"):  # not a JSON error: never parsed
        c.unpack(frames)


def test_replayed_message_is_rejected():
    frames = Codec(KEY).pack(make_message("set", {}, session="s"))
    rx = Codec(KEY)
    rx.unpack(frames)
    with pytest.raises(AuthError, match="replayed"):
        rx.unpack(frames)


def test_stale_message_is_rejected():
    old = Message(Header("id1", "get", "s", time.time() - 3600), {})
    with pytest.raises(AuthError, match="stale"):
        Codec(KEY).unpack(Codec(KEY).pack(old))


def test_other_protocol_major_version_is_a_protocol_error():
    m = Message(Header("id2", "get", "s", time.time(), version="2.0"), {})
    with pytest.raises(ProtocolError, match="version"):
        Codec(KEY).unpack(Codec(KEY).pack(m))


def test_topic_is_covered_by_the_signature():
    frames = Codec(KEY).pack(make_message("metric", {"seq": 1}, session="s"), topic=b"metric")
    Codec(KEY).unpack(frames, topic=True)
    frames[0] = b"event"
    with pytest.raises(AuthError, match="bad signature"):
        Codec(KEY).unpack(frames, topic=True)


def test_short_keys_are_refused():
    with pytest.raises(AuthError, match="at least 16 bytes"):
        Codec(b"short")
