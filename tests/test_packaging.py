"""The package as a user installs it: the wheel carries the compiled JupyterLab extension
and the config that enables the server extension (no Node.js needed to install it), and in
this environment Jupyter lists both extensions enabled and OK. The wheel is built from a
copy of the sources without the built extension, so the build compiles labextension/src
(a TypeScript change that breaks the build fails here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from the files git knows (tracked, or new and not ignored): not
    the extension built in this checkout (hpinteract/labextension, ignored), which the
    build would otherwise keep (pyproject's skip-if-exists). The installed Node packages
    are linked, not copied or fetched."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    assert not (src / "hpinteract" / "labextension").exists()
    for installed in ("node_modules", ".yarn"):
        (src / "labextension" / installed).symlink_to(ROOT / "labextension" / installed)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(tmp), str(src)], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert (src / "hpinteract" / "labextension" / "static" / "style.js").exists()
    [built] = tmp.glob("hpinteract-*.whl")
    return built


@pytest.mark.timeout(900)  # the first user of the wheel builds it: the extension too
def test_the_wheel_carries_the_built_extension_and_the_server_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    ext = DATA + "share/jupyter/labextensions/hpinteract/"
    assert {ext + "package.json", ext + "install.json", ext + "static/style.js"} <= names
    assert any(re.fullmatch(re.escape(ext) + r"static/remoteEntry\.\w+\.js", n) for n in names)
    assert DATA + "etc/jupyter/jupyter_server_config.d/hpinteract.json" in names
    assert {"hpinteract/server/__init__.py", "hpinteract/labextension/package.json"} <= names
    assert not any("node_modules" in n or n.endswith(".ts") for n in names)


def link_torch(venv: Path) -> None:
    """The torch distribution of this environment, every top-level entry of its RECORD
    (the packages and the dist-info; not its scripts), linked into ``venv``."""
    import torch

    site = Path(torch.__file__).parent.parent
    [dist] = site.glob(f"torch-{torch.__version__}.dist-info")
    record = (dist / "RECORD").read_text().splitlines()
    tops = {line.split("/", 1)[0] for line in record if "/" in line.split(",", 1)[0]}
    [target] = (venv / "lib").glob("python3*/site-packages")
    for top in sorted(tops - {".."}):
        (target / top).symlink_to(site / top)


NOTEBOOK = [
    "import hpinteract as hpi\n%load_ext hpinteract",
    "def train(run):\n"
    "    import torch\n"
    "    model = torch.nn.Linear(4, 1)\n"
    "    opt = torch.optim.SGD(model.parameters(), lr=run.hp['lr'])\n"
    "    run.watch(model, opt)\n"
    "    x = torch.randn(64, 4)\n"
    "    import time\n"
    "    end = time.monotonic() + 120  # a notebook that failed leaves no job behind\n"
    "    while not run.should_stop and time.monotonic() < end:\n"
    "        loss = (model(x) - 1).pow(2).mean()\n"
    "        opt.zero_grad(); loss.backward(); opt.step()\n"
    "        run.step(loss=loss)\n",
    "job = hpi.launch(train, nproc=1, hparams={'lr': 0.1})\ndash = job.dashboard()\ndash",
    "await dash.until(step=20)\n%hp attach {job.id}\nack = %hp set lr=0.05\n%hp stop\n"
    "assert job.wait(120) == hpi.JobState.FINISHED, job.error\n"
    "assert job.metrics().set_index('step')['lr'][ack.applied_at_step] == 0.05",
]


@pytest.mark.timeout(900)  # a fresh venv's installs: minutes where pip's cache is cold
def test_a_plain_pip_install_gives_the_whole_notebook_experience(tmp_path, wheel):
    """A fresh environment, ``pip install`` of the built wheel and nothing else but the
    notebook runner: the dashboard, the widgets and %hp work, and Jupyter's server finds
    the side panel's extension (its packages are dependencies, not extras to guess)."""
    import nbformat

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # torch first, as the README says: this machine's own, linked in (installing its 900 MB
    # again would test pip, not us; pip takes it as installed and resolves its
    # requirements), then the wheel: pip resolves the rest from its requirements.
    link_torch(venv)
    # --no-compile: Python compiles what it imports anyway; pip compiling every module of
    # ~90 packages first is half the install's time.
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-compile", str(wheel),
                    "nbclient"], check=True, timeout=900)
    assert subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True,
                          timeout=120).returncode == 0
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK]
    path = tmp_path / "fresh.ipynb"
    nbformat.write(nb, path)
    code = ("import sys, nbformat\nfrom nbclient import NotebookClient\n"
            "nb = nbformat.read(sys.argv[1], as_version=4)\n"
            "NotebookClient(nb, timeout=180, kernel_name='python3').execute()\n"
            "nbformat.write(nb, sys.argv[1])\n")
    r = subprocess.run([str(py), "-c", code, str(path)], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    outputs = [o for c in nbformat.read(path, as_version=4).cells for o in c.outputs]
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
               for o in outputs), "the dashboard was not displayed"
    server = subprocess.run([str(venv / "bin" / "jupyter"), "server", "extension", "list"],
                            capture_output=True, text=True, timeout=120)
    listed = re.sub(r"\x1b\[[0-9;]*m", "", server.stdout + server.stderr)
    assert re.search(r"hpinteract 0\.1\.0 OK", listed), listed
