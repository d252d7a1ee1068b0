"""A real Jupyter server with the extension loaded (pytest-jupyter), and one 2-rank job."""

from __future__ import annotations

import pytest
from helpers import TOY, wait_for_step

import hpinteract as hpi


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"hpinteract": True}}}


@pytest.fixture(scope="module")
def job():
    j = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.004}, args=["--n", "2048"])
    wait_for_step(j, 5)
    yield j
    if not j.state.terminal:
        j.stop()
    j.wait(60)
