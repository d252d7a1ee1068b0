"""The dependency direction of DESIGN.md, checked on the source: protocol <- transport <-
trainer / client <- notebook / server / cli; and the client side never imports torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).parents[1] / "hpinteract"
# Which of the package's own layers each layer may import.
ALLOWED = {
    "protocol": {"protocol"},
    "transport": {"protocol", "transport"},
    "trainer": {"protocol", "transport", "policies", "trainer"},
    # A framework job is an ordinary job to every client: the callbacks stand on the Run.
    "integrations": {"protocol", "trainer", "integrations"},
    "client": {"protocol", "transport", "policies", "client"},
    "policies": {"protocol", "policies"},
    "notebook": {"protocol", "transport", "client", "policies", "notebook"},
    "server": {"protocol", "transport", "client", "policies", "server"},
}
TORCH_FREE = {"protocol", "transport", "client", "policies", "notebook", "server"}
# The exceptions, each with its reason: Job.dashboard()/plot() are DESIGN's public API on
# the client's Job, and open the notebook layer when called (inside the method, so the
# client loads without it: test_importing_the_client_loads_no_torch_nor_the_notebook).
EXCEPTIONS = {("client/job.py", "notebook")}


def imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.module or "", node.level))
    return out


def layer_of(name: str, level: int, here: str) -> str | None:
    if level == 0:
        parts = name.split(".")
        return parts[1] if parts[0] == "hpinteract" and len(parts) > 1 else None
    if level == 1:
        return here
    return name.split(".")[0] if name else None


def test_layers_import_only_downwards():
    bad = []
    for layer, allowed in ALLOWED.items():
        files = sorted((PKG / layer).rglob("*.py"))
        assert files, f"layer {layer} has no modules: ALLOWED is out of date"
        for py in files:
            for name, level in imports(py):
                target = layer_of(name, level, layer)
                rel = str(py.relative_to(PKG))
                if (rel, target) in EXCEPTIONS:
                    continue
                if target is not None and target in ALLOWED and target not in allowed:
                    bad.append(f"{py.relative_to(PKG)} imports {target}")
                if layer in TORCH_FREE and level == 0 and name.split(".")[0] == "torch":
                    bad.append(f"{py.relative_to(PKG)} imports torch")
    assert not bad, bad


def test_every_layer_is_checked():
    layers = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert layers - {"labextension"} == set(ALLOWED), "a layer without rules in ALLOWED"


def test_the_trainer_knows_no_framework():
    """Nothing framework-specific reaches the trainer (or below): only integrations/
    imports Lightning or transformers."""
    bad = [str(py.relative_to(PKG)) for py in PKG.rglob("*.py")
           if not py.is_relative_to(PKG / "integrations")
           for name, level in imports(py) if level == 0 and name.split(".")[0] in
           ("lightning", "pytorch_lightning", "transformers", "accelerate")]
    assert not bad, bad


def test_importing_the_client_loads_no_torch_nor_the_notebook():
    code = ("import sys, hpinteract, hpinteract.client, hpinteract.cli\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "assert 'hpinteract.notebook' not in sys.modules, 'the notebook layer was'\n"
            "assert 'bokeh' not in sys.modules, 'bokeh was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
