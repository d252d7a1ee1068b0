"""CurveZMQ for the control and metrics sockets: encryption, and a server that only
those holding the connection file can reach.

Runs in: rank 0's coordinator (``ServerKeys``, ``secure_server``) and clients
(``secure_client``). The HMAC signature authenticates every message either way; CURVE adds
confidentiality. It is on whenever the job binds a non-loopback address (remote use), and
on loopback too with ``HPINTERACT_CURVE=1`` (a shared host, where another local user could
otherwise read the metrics). The server's public key travels only in the owner-only
connection file; its secret key never leaves the coordinator's memory. Each client makes a
fresh key pair: the server does not check client keys (no ZAP handler), since the HMAC key
already decides who may act.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any

import zmq

from ..protocol.errors import ConfigError


def curve_wanted(ip: str) -> bool:
    """Whether a job bound to ``ip`` encrypts its sockets."""
    forced = os.environ.get("HPINTERACT_CURVE", "").strip().lower() in ("1", "true", "yes")
    return forced or not ipaddress.ip_address(ip).is_loopback


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes = field(repr=False)

    @classmethod
    def new(cls) -> ServerKeys:
        if not zmq.has("curve"):
            raise ConfigError("this libzmq has no CURVE support: remote use needs it (or "
                              "bind to loopback and reach it through an SSH tunnel)")
        public, secret = zmq.curve_keypair()
        return cls(public, secret)


def secure_server(sock: zmq.Socket[Any], keys: ServerKeys | None) -> None:
    """Before bind: the socket takes only CURVE handshakes made with ``keys.public``."""
    if keys is not None:
        sock.curve_server = True
        sock.curve_secretkey = keys.secret


def secure_client(sock: zmq.Socket[Any], server_public: bytes | None) -> None:
    """Before connect: handshake with the server whose public key the connection file
    holds (nothing to do for a job without CURVE)."""
    if server_public:
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey = server_public
        sock.curve_publickey = public
        sock.curve_secretkey = secret
