"""JupyterLab on loopback and headless Chromium, for the real-browser tests.

Chromium must be at /usr/bin/chromium (``.ci/run`` installs Debian's package): where it is
missing the tests fail saying so, since a skip would hide a broken browser path in CI.
HPI_SKIP_BROWSER=1 leaves them out deliberately on a machine without one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
CHROMIUM = Path("/usr/bin/chromium")
OUTPUT = ROOT / "build" / "test-output"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

browser_test = pytest.mark.skipif(os.environ.get("HPI_SKIP_BROWSER") == "1",
                                  reason="HPI_SKIP_BROWSER=1: the browser test left out")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_chromium() -> None:
    assert CHROMIUM.exists(), (f"{CHROMIUM} is missing: install Debian's chromium (.ci/run "
                               "does), or set HPI_SKIP_BROWSER=1 to leave this test out")


@contextlib.contextmanager
def jupyterlab(root_dir: Path, home: Path, log_path: Path) -> Iterator[tuple[str, str]]:
    """A Jupyter server serving ``root_dir`` on 127.0.0.1 with a token, with JupyterLab at
    /lab and Notebook 7 at /notebooks: yields (base URL, token)."""
    token, port = secrets.token_hex(16), free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
             f"--port={port}", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={root_dir}", "--allow-root",
             "--LabApp.expose_app_in_browser=True",  # window.jupyterapp, for the tests
             "--JupyterNotebookApp.expose_app_in_browser=True",  # ... in Notebook 7 too
             # A fresh layout and settings each time: nothing restored from an earlier run.
             f"--LabApp.workspaces_dir={log_path.parent / 'workspaces'}",
             f"--LabApp.user_settings_dir={log_path.parent / 'settings'}"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HPINTERACT_HOME": str(home)})
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    time.sleep(0.2)
            yield f"http://127.0.0.1:{port}", token
        finally:
            proc.terminate()
            proc.wait(20)
