"""Entry point of every rank of a launched job: runs the user's script as ``__main__``
(the script and its arguments come from the run directory's job.json).

Runs in: each torchrun worker process. Wrapping the script in torch.distributed.elastic's
``record`` writes the rank's exception into torchrun's per-rank error file, so the
supervisor can report which rank failed and why (the root cause, not the ranks that were
torn down after it).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from ..protocol.rundir import RunDir, read_json


@record  # type: ignore[untyped-decorator]  # torch is not type-checked here
def main() -> None:
    run_dir = os.environ.get("HPINTERACT_RUN_DIR")
    job = read_json(RunDir(run_dir).job_file) if run_dir else None
    if job is None:
        raise SystemExit("hpinteract bootstrap: HPINTERACT_RUN_DIR has no job.json")
    script = str(Path(job["script"]).resolve())
    sys.argv = [script, *map(str, job.get("args", []))]
    sys.path.insert(0, str(Path(script).parent))  # as `python script.py` would
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
