"""binder/ installs what pyproject says a notebook user needs: the same package set."""

from __future__ import annotations

import os
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).parents[1]
EXTRAS = ("notebook", "lab", "examples", "lightning", "transformers")


def normal(req: str) -> str:
    """A requirement without spaces and comments, its name lower-case and dash-normal."""
    req = req.split("#", 1)[0].strip().strip('"').replace(" ", "")
    m = re.match(r"([A-Za-z0-9_.-]+)(.*)", req)
    assert m, req
    return re.sub(r"[-_.]+", "-", m[1]).lower() + m[2]


def binder_pip() -> list[str]:
    lines = (ROOT / "binder" / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    out = []
    for line in lines[start + 1:]:
        item = line.strip()
        if item.startswith("#"):
            continue
        if not item.startswith("- "):
            break
        out.append(item[2:].split("#", 1)[0].strip().strip('"'))
    return out


def test_binder_installs_the_same_packages_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = project["dependencies"] + [r for e in EXTRAS
                                      for r in project["optional-dependencies"][e]]
    got = [r for r in binder_pip() if not r.startswith("--")]
    assert sorted(map(normal, got)) == sorted(map(normal, want))


def test_binder_builds_the_package_itself_with_node_and_a_cpu_torch():
    env = (ROOT / "binder" / "environment.yml").read_text()
    assert re.search(r"^\s*- nodejs", env, re.M)  # the extension's build needs it
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in binder_pip()
    post = ROOT / "binder" / "postBuild"
    assert os.access(post, os.X_OK)
    assert "pip install --no-deps ." in post.read_text()
