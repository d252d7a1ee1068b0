"""Connection files: how a client finds and authenticates to a job's coordinator.

Runs in: rank 0 (writes) and clients (read). Modelled on jupyter_client's connect.py: a
small JSON file, owner-only (0600), holding the address, both ports, the HMAC key, the job
id, the protocol version and the coordinator's pid. Whoever can read it can control the job,
which is why it is never world-readable and never sent over a socket.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import ProtocolError
from .messages import PROTOCOL_VERSION
from .rundir import atomic_write_json, read_json


def connection_stamp(path: Path) -> tuple[int, int] | None:
    """Which connection file this is (written anew, atomically, by every coordinator: a
    restarted job's has other ports and another key); None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def new_key() -> str:
    return secrets.token_hex(32)


@dataclass(frozen=True)
class ConnectionInfo:
    job_id: str
    ip: str
    control_port: int
    pub_port: int
    key: str = field(repr=False)  # never in a repr: notebooks and tracebacks show reprs
    pid: int = 0
    hostname: str = socket.gethostname()
    transport: str = "tcp"
    signature_scheme: str = "hmac-sha256"
    version: str = PROTOCOL_VERSION
    curve_server_key: str = ""  # the job's CURVE public key (Z85); empty: no CURVE

    @property
    def control_url(self) -> str:
        return f"{self.transport}://{self.ip}:{self.control_port}"

    @property
    def pub_url(self) -> str:
        return f"{self.transport}://{self.ip}:{self.pub_port}"

    @property
    def key_bytes(self) -> bytes:
        return self.key.encode()

    @property
    def server_key(self) -> bytes | None:
        return self.curve_server_key.encode() if self.curve_server_key else None

    def write(self, path: Path) -> None:
        atomic_write_json(path, asdict(self), mode=0o600)

    @classmethod
    def read(cls, path: Path) -> ConnectionInfo:
        data = read_json(path)
        if data is None:
            raise FileNotFoundError(f"no connection file at {path}")
        if os.stat(path).st_mode & 0o077:
            raise ProtocolError(f"{path} is readable by others; refusing to use its key")
        try:
            return cls(
                job_id=str(data["job_id"]),
                ip=str(data["ip"]),
                control_port=int(data["control_port"]),
                pub_port=int(data["pub_port"]),
                key=str(data["key"]),
                pid=int(data["pid"]),
                hostname=str(data.get("hostname", "")),
                transport=str(data.get("transport", "tcp")),
                signature_scheme=str(data.get("signature_scheme", "hmac-sha256")),
                version=str(data.get("version", PROTOCOL_VERSION)),
                curve_server_key=str(data.get("curve_server_key", "")),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ProtocolError(f"malformed connection file {path}: {exc}") from None
