"""A real IPython kernel for the notebook tests (``from nb_kernel import Kernel``: tests/ is on
the path, and a module under tests/notebook/ would be shadowed by Notebook 7's package).

Runs in: the pytest process, driving a kernel subprocess over jupyter_client. Code runs
in the kernel as a cell would, on the kernel's event loop, so the dashboard's ticker,
widgets and comms are the real ones; only the browser is absent.
"""

from __future__ import annotations

import queue
import textwrap
from typing import Any

from jupyter_client.manager import KernelManager


class Kernel:
    def __init__(self) -> None:
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 120.0) -> str:
        """Run a cell; its stdout, or AssertionError with the cell's traceback."""
        out: list[str] = []
        errors: list[str] = []

        def collect(msg: dict[str, Any]) -> None:
            t, c = msg["msg_type"], msg["content"]
            if t == "stream" and c.get("name") == "stdout":
                out.append(c["text"])
            elif t == "error":
                errors.append("\n".join(c["traceback"]))

        try:
            reply = self.kc.execute_interactive(textwrap.dedent(code), timeout=timeout,
                                                output_hook=collect)
        except (TimeoutError, queue.Empty) as exc:
            raise AssertionError(f"the cell did not finish in {timeout}s:\n{code}") from exc
        if reply["content"]["status"] != "ok" or errors:
            raise AssertionError("the cell failed:\n" + "\n".join(errors) + f"\n---\n{code}")
        return "".join(out)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
