"""Shared fixtures: an isolated HPINTERACT_HOME, and helpers to launch the toy job."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# A real Jupyter server per test, for the server extension's handlers (tests/server).
pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture(scope="session", autouse=True)
def hpi_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("hpi-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("HPINTERACT_HOME", str(home))
    yield home
    mp.undo()
