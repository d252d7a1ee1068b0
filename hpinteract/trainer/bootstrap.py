"""Entry point of every rank of a launched job: runs the user's script as ``__main__``.

Runs in: each torchrun worker process. Wrapping the script in torch.distributed.elastic's
``record`` writes the rank's exception into torchrun's per-rank error file, so the
supervisor can report which rank failed and why (the root cause, not the ranks that were
torn down after it).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m hpinteract.trainer.bootstrap SCRIPT [ARGS...]")
    script = str(Path(sys.argv[1]).resolve())
    sys.argv = [script, *sys.argv[2:]]
    sys.path.insert(0, str(Path(script).parent))  # as `python script.py` would
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
