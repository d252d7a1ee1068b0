"""Nothing that comes over a socket is unpickled or evaluated: the modules that receive
messages (and everything in protocol/, transport/, server/) import no pickle-like module
and call no eval/exec; every torch.load in the package passes weights_only=True."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).parents[1] / "hpinteract"
WIRE = [*PKG.glob("protocol/*.py"), *PKG.glob("transport/*.py"), *PKG.glob("server/*.py"),
        *(PKG / "trainer" / n for n in ("coordinator.py", "requests.py", "commands.py",
                                        "journal.py", "policy_host.py", "boundary.py",
                                        "link.py", "forked.py", "control_process.py")),
        *(PKG / "client" / n for n in ("job.py", "stream.py", "history.py", "policies.py"))]
UNSAFE_MODULES = {"pickle", "cloudpickle", "dill", "marshal", "shelve", "joblib", "yaml"}
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}


def _findings(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        out += [f"{path.name}:{node.lineno} imports {n}" for n in names
                if n.split(".")[0] in UNSAFE_MODULES]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in UNSAFE_CALLS):
            out.append(f"{path.name}:{node.lineno} calls {node.func.id}")
    return out


def test_the_wire_code_neither_unpickles_nor_evaluates():
    assert len(WIRE) > 20 and all(p.is_file() for p in WIRE)
    assert [f for p in WIRE for f in _findings(p)] == []


def test_the_scan_sees_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nfrom yaml import load\nx = eval('1')\n")
    assert len(_findings(bad)) == 3


def test_every_torch_load_is_weights_only():
    calls = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "load" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "torch"):
                kw = {k.arg: k.value for k in node.keywords}
                ok = isinstance(kw.get("weights_only"), ast.Constant) and \
                    kw["weights_only"].value is True
                calls.append((path.name, node.lineno, ok))
    assert calls and all(ok for *_, ok in calls), calls
