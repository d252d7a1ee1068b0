"""``hpi.init``: join the process group, find the run directory and what the launcher
asked for (a resume, a restart's checkpoint, a replay), and make the script's Run.

Runs in: every rank's training thread, once, at the script's start. Rank 0 rewinds the
logs of a resumed or restarted job here, before its coordinator opens them.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Mapping
from typing import Any

from ..protocol.failures import write_rank_failure
from ..protocol.hparams import HParam
from ..protocol.rundir import RunDir, read_json
from .distributed import Topology, control_group, ensure_process_group
from .nodes import join_nodes, nodes_start
from .own_torchrun import record_agent, run_dir_for_rank0
from .replay import ReplaySchedule
from .restart import attempt
from .resume import history_to_redo, load_resume, rewind_logs
from .run import Run
from .sync import StepSync


def init(
    hparams: Mapping[str, Any] | None = None,
    specs: Mapping[str, HParam] | None = None,
    *,
    backend: str | None = None,
    sync_every: int | None = None,
    sync_budget: float = 0.01,
    ip: str = "127.0.0.1",
    policies: list[Any] | None = None,
) -> Run:
    """Join (or create) the process group and start the job's control plane.

    ``hparams`` are the script's defaults; values given to ``hpi.launch(hparams=...)``
    override them. ``sync_every`` fixes the distance in steps between control sync points
    (default: chosen so control costs at most ``sync_budget`` of training time).
    ``ip`` is where rank 0's coordinator binds (``HPINTERACT_IP``, which
    ``hpi.launch(ip=...)`` sets, wins). ``policies`` are built-in Policy objects (or
    ``(policy, every)`` pairs) that rank 0 runs from the start; the other ranks ignore them.
    """
    topo = ensure_process_group(backend)
    group = control_group()
    sync = StepSync(group, topo.rank, budget=sync_budget, every=sync_every)
    # The first exchange tells every rank where the run directory is (and, on several
    # nodes, the job's attempt and whether the nodes share that directory: nodes.py).
    run_dir = None
    init_op: list[dict[str, Any]] | None = None
    env_dir = os.environ.get("HPINTERACT_RUN_DIR")
    if topo.rank == 0:
        run_dir = RunDir(env_dir) if env_dir else run_dir_for_rank0()
        init_op = [{"op": "init", "run_dir": str(run_dir.path), **nodes_start(run_dir)}]
    if not env_dir and topo.local_rank == 0:  # a user's own torchrun: see own_torchrun.py
        record_agent()
    first = sync.exchange(init_op)[0]
    # On several nodes each may have its own (its launcher's): rank 0's may be on another
    # machine; where they share one, it is the same directory.
    own = os.environ.get("HPINTERACT_RUN_DIR")
    shared = join_nodes(first, own, group)
    run_dir = RunDir(own if own and topo.rank != 0 and not shared else first["run_dir"])
    try:
        return _make_run(topo, group, sync, run_dir, hparams, specs,
                         os.environ.get("HPINTERACT_IP") or ip, policies)
    except Exception as exc:
        # Before the Run's exception hook exists: this rank's own account of the failure
        # (a bad launch override, a checkpoint that will not load), so that the cause is
        # named even when the process then dies tearing gloo down (protocol/failures.py).
        with contextlib.suppress(OSError):
            write_rank_failure(run_dir, attempt(), topo.rank, 0, type(exc).__name__,
                               str(exc), traceback.format_exc())
        raise


def _make_run(topo: Topology, group: Any, sync: StepSync, run_dir: RunDir,
              hparams: Mapping[str, Any] | None, specs: Mapping[str, HParam] | None, ip: str,
              policies: list[Any] | None) -> Run:
    job = read_json(run_dir.job_file) or {}
    resume = load_resume(run_dir, job)
    # The launch's overrides are in a restarted job's own checkpoint already, and later
    # changes may have replaced them there: applied again they would undo those.
    overrides = {} if resume is not None and resume.own else dict(job.get("hparams") or {})
    redo: list[dict[str, Any]] = []
    if topo.rank == 0 and (resume is not None or attempt() > 0):
        if resume is not None:
            redo = history_to_redo(run_dir, resume, overrides)
        rewind_logs(run_dir, resume, job)  # before the coordinator opens them
    if resume is not None:  # every rank makes the same changes again at the same steps
        redo = sync.exchange([{"op": "redo", "changes": redo}] if topo.rank == 0
                             else None)[0]["changes"]
    return Run(topo, group, sync, run_dir, dict(hparams or {}), dict(specs or {}),
               overrides, ip, list(policies or []), resume,
               ReplaySchedule(job.get("replay"), resume.step if resume else 0, redo))
