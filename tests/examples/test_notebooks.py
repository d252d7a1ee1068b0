"""The example notebooks, executed headlessly in a real kernel (nbclient), as a user would
run them top to bottom: each launches real 2-rank jobs and asserts, in its own cells, that
the jobs finished and that the changes applied at the acknowledged steps."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).parents[2] / "examples"
NOTEBOOKS = sorted(p.name for p in EXAMPLES.glob("*.ipynb"))


def test_every_example_notebook_is_tested():
    assert NOTEBOOKS == ["01_quickstart.ipynb", "02_policies.ipynb", "03_magics.ipynb",
                         "04_lightning.ipynb", "05_transformers.ipynb"]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_runs_top_to_bottom(name):
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(EXAMPLES)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.get("output_type") == "error"]
    assert not errors
    widgets = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widgets, "the dashboard was not displayed"
