"""The package as a user installs it: the wheel carries the compiled JupyterLab extension
and the config that enables the server extension (no Node.js needed to install it), and in
this environment Jupyter lists both extensions enabled and OK."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[1]
DATA = "hpinteract-0.1.0.data/data/"


def jupyter(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "jupyter", *args], capture_output=True,
                       text=True, timeout=120)
    return re.sub(r"\x1b\[[0-9;]*m", "", r.stdout + r.stderr)  # without colour codes


def test_jupyter_lists_both_extensions_enabled_and_ok():
    lab = jupyter("labextension", "list")
    assert re.search(r"hpinteract v0\.1\.0 enabled OK", lab), lab
    server = jupyter("server", "extension", "list")
    assert re.search(r"hpinteract enabled", server), server
    assert re.search(r"hpinteract 0\.1\.0 OK", server), server


def test_the_wheel_carries_the_built_extension_and_the_server_config(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, timeout=600)
    [wheel] = tmp_path.glob("hpinteract-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    ext = DATA + "share/jupyter/labextensions/hpinteract/"
    assert {ext + "package.json", ext + "install.json", ext + "static/style.js"} <= names
    assert any(re.fullmatch(re.escape(ext) + r"static/remoteEntry\.\w+\.js", n) for n in names)
    assert DATA + "etc/jupyter/jupyter_server_config.d/hpinteract.json" in names
    assert {"hpinteract/server/__init__.py", "hpinteract/labextension/package.json"} <= names
    assert not any("node_modules" in n or n.endswith(".ts") for n in names)
