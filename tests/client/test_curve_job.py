"""A job whose sockets use CURVE (``HPINTERACT_CURVE=1``; remote binds get it always):
its connection file carries the server's public key, a Job controls and streams it as
usual, and a client without that key gets nothing back."""

from __future__ import annotations

import json

import pytest
import zmq
from helpers import TOY, wait_for_step

import hpinteract as hpi
from hpinteract.protocol.connection import ConnectionInfo
from hpinteract.protocol.errors import HpiTimeout
from hpinteract.transport.control import ControlClient


def test_a_curve_job_is_controlled_with_the_key_and_deaf_without_it():
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.004}, env={"HPINTERACT_CURVE": "1"})
    try:
        wait_for_step(job, 5)
        info = ConnectionInfo.read(job.run_dir.connection)
        assert len(info.curve_server_key) == 40  # Z85 of 32 bytes
        # Only the public key is written: the secret one stays in the coordinator's memory.
        assert not [k for k in json.loads(job.run_dir.connection.read_text()) if "secret" in k]
        assert job.set(lr=0.02).applied_at_step > 0
        assert job.hparams["lr"] == 0.02
        seen = []
        for rec in job.stream():  # history then live, through the CURVE subscriber
            seen.append(rec)
            if "kind" not in rec and rec["seq"] > 0 and len(seen) > 20:
                break
        assert any("loss" in r for r in seen)
        plain = ControlClient(zmq.Context.instance(), info.control_url, info.key_bytes,
                              timeout_s=1.0, retries=0)
        with pytest.raises(HpiTimeout):  # the HMAC key alone does not open a CURVE socket
            plain.request("get")
        plain.close()
    finally:
        job.stop()
        job.wait(60)
