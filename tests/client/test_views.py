"""job.dashboard() in an environment that lacks a notebook package says which and how."""

import subprocess
import sys


def test_a_missing_notebook_package_is_named_with_the_fix():
    code = ("import sys\nsys.modules['bokeh'] = None  # as if it were not installed\n"
            "from hpinteract.client.job import _dashboard\n"
            "from hpinteract.protocol.errors import ConfigError\n"
            "try:\n    _dashboard()\nexcept ConfigError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "job.dashboard() needs 'bokeh'" in out and "pip install hpinteract" in out
