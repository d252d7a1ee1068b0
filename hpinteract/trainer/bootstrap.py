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
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from ..protocol.rundir import RunDir, read_json
from .ending import exited_with


@record  # type: ignore[untyped-decorator]  # torch is not type-checked here
def main() -> None:
    run_dir = os.environ.get("HPINTERACT_RUN_DIR")
    job = read_json(RunDir(run_dir).job_file) if run_dir else None
    if job is None or run_dir is None:
        raise SystemExit("hpinteract bootstrap: HPINTERACT_RUN_DIR has no job.json")
    if job.get("function"):
        run_function(RunDir(run_dir), job)
        return
    script = str(Path(job["script"]).resolve())
    sys.argv = [script, *map(str, job.get("args", []))]
    sys.path.insert(0, str(Path(script).parent))  # as `python script.py` would
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            exited_with(exc.code)
        raise


def run_function(run_dir: RunDir, job: dict[str, Any]) -> None:
    """A function launched from a notebook: ``hpi.init`` with the launch's arguments, then
    ``fn(run)``, then ``run.finish()``. The pickle is the launching user's own file in
    the owner-only run directory (client.launch wrote it); anything else is refused
    rather than unpickled."""
    import cloudpickle

    path = run_dir.path / str(job["function"])
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or path.parent.stat().st_mode & 0o077:
        raise SystemExit(f"hpinteract bootstrap: {path} is not an owner-only file of this "
                         "user; refusing to load it")
    payload = cloudpickle.loads(path.read_bytes())
    sys.path.insert(0, str(job.get("cwd") or os.getcwd()))  # the notebook's own modules
    from ..trainer.start import init

    run = init(hparams=job.get("hparams") or {}, **payload.get("init", {}))
    payload["fn"](run)
    run.finish()


if __name__ == "__main__":
    main()
