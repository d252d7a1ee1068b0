"""Resizing a running job: ``workers`` is a hyper-parameter like any other.

Runs in: every rank's training thread (the spec, the check of a new value, the way out at
the resize boundary), rank 0 (the record it leaves for the supervisor, the latency event of
the restarted job) and the supervisor (which reads the record and starts torchrun again).

A change of ``workers`` travels the way every change does: rank 0's coordinator validates
it, every rank applies it at the same step boundary and the client is acknowledged with that
step. There the job checkpoints (after the boundary's other changes, so the checkpoint holds
them), every rank leaves, and the supervisor starts torchrun with the new number of ranks.
They resume from that checkpoint as an automatic restart does: the same run directory, logs
and step count, the global batch planned anew as micro-batches and accumulation for the new
world (batching.py), the hyper-parameters and policies' state from the checkpoint.

Why a new torchrun rather than torchrun's elastic membership: elastic resizing adds or
removes *nodes* (agents) within ``--nnodes=MIN:MAX`` and restarts every worker anyway; the
number of ranks per node, which is what a job on one machine changes, is fixed for an
agent's life. Either way the price is a restart of the workers, which is what this measures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..protocol.errors import InvalidHParam
from ..protocol.hparams import HParam
from ..protocol.rundir import RunDir, atomic_write_json, read_json
from ..protocol.states import JobState
from .distributed import leave_together
from .nodes import node_count, nodes_shared

if TYPE_CHECKING:
    from .run import Run

RECORD = "resize.json"  # in the run directory, from the leaving rank 0 to the supervisor
SOURCE = "job:resize"  # the source of the checkpoint a resize takes
# Ranks on CPU are processes sharing the machine's cores: more of them than cores is slow
# but legal, so the bound is a sanity limit; on GPUs it is one rank per device.
CPU_MAX = 64

# Rank 0 of a restarted job: when its start reached hpi.init (see restarted()).
_restarted_at: float | None = None


def workers_spec(world: int, devices: int | None) -> HParam:
    high = devices if devices else CPU_MAX
    return HParam(world, low=1, high=max(high, world), kind="int",
                  doc="ranks of the job: a change checkpoints at a step boundary and "
                      "restarts the job with that many, the same global batch and logs")


def workers_check(world: int, why_not: Callable[[], str | None]) -> Callable[
        [dict[str, Any], Mapping[str, Any]], None]:
    """A store constraint: a new ``workers`` needs a job that can be restarted (launched by
    ``hpi.launch``, on one node or on nodes that share the run directory, its model
    watched; on several nodes a multiple of their number); ``why_not()`` says what is
    missing."""

    def check(changes: dict[str, Any], merged: Mapping[str, Any]) -> None:
        if "workers" not in changes or int(changes["workers"]) == world:
            return
        reason = why_not()
        if reason:
            raise InvalidHParam(f"cannot resize this job: {reason}", field="workers")
        nodes = node_count()  # each torchrun agent starts the same number of ranks
        if int(changes["workers"]) % nodes:
            raise InvalidHParam(f"cannot resize this job to {changes['workers']} ranks: it "
                                f"runs on {nodes} nodes, each with the same number of "
                                f"ranks: use a multiple of {nodes}", field="workers")

    return check


def write_record(run_dir: RunDir, record: dict[str, Any]) -> None:
    """Rank 0, after its coordinator closed (the checkpoint is on disk): what the
    supervisor needs to start the job again."""
    atomic_write_json(run_dir.path / RECORD, record)


def peek_record(run_dir: RunDir) -> dict[str, Any] | None:
    """The supervisor: the resize rank 0 recorded, if any and well formed (left in place)."""
    record = read_json(run_dir.path / RECORD)
    if record is None or not isinstance(record.get("to"), int) or record["to"] < 1:
        return None
    return record


def take_record(run_dir: RunDir) -> dict[str, Any] | None:
    """The supervisor, after torchrun returned: the resize the job asked for, if any (the
    file is removed, so that a later clean end is not taken for another resize)."""
    record = peek_record(run_dir)
    (run_dir.path / RECORD).unlink(missing_ok=True)
    return record


class Records:
    """The supervisor's view of the resize record. On one node it takes the file (removes
    it). Where the supervisors of several nodes share the run directory each must read the
    same record, so none removes it: each remembers the records it took, and rank 0 writes
    the next resize's over it (a record is known by its boundary's time and step)."""

    def __init__(self, run_dir: RunDir, shared: bool) -> None:
        self._run_dir, self._shared = run_dir, shared
        self._seen: set[str] = set()
        # A record no torchrun of this supervisor wrote (a resize whose end failed, or a
        # supervisor killed before taking it; resume= reuses the run directory) is stale.
        self.take()

    def fresh(self) -> dict[str, Any] | None:
        record = peek_record(self._run_dir)
        if record is None or json.dumps(record, sort_keys=True) in self._seen:
            return None
        return record

    def take(self) -> dict[str, Any] | None:
        if not self._shared:
            return take_record(self._run_dir)
        record = self.fresh()
        if record is not None:
            self._seen.add(json.dumps(record, sort_keys=True))
        return record


def rdzv_id(job_id: str, record: dict[str, Any]) -> str:
    """The rendezvous of the job after this resize: a new one, as the agents closed the
    last (torchrun's c10d store, kept by the supervisor that hosts it, still holds it)."""
    return f"{job_id}-resized-{record.get('step')}-{int(float(record.get('boundary', 0)))}"


def relaunch_env(record: dict[str, Any]) -> str:
    return json.dumps({**record, "relaunched": time.time()})


def restarted() -> None:
    """Rank 0 of a resized job, in hpi.init before it opens the logs."""
    global _restarted_at
    _restarted_at = time.time()


def done_event(record: dict[str, Any], step: int, world: int) -> dict[str, Any]:
    """The event rank 0 of the resized job posts when its first step has ended: the resize
    and its latency, phase by phase (seconds)."""
    now = time.time()
    boundary = float(record.get("boundary", now))
    left = float(record.get("left", boundary))
    start = _restarted_at if _restarted_at is not None else left
    relaunched = float(record.get("relaunched", left))
    return {
        "kind": "resize", "status": "done", "step": step, "from": record.get("from"),
        "to": world, "id": record.get("id"), "source": record.get("source", "api"),
        "checkpoint_s": round(left - boundary, 4),  # capture, write, logs closed
        "restart_s": round(start - left, 4),  # exit, torchrun, interpreters, rendezvous
        "exit_s": round(relaunched - left, 4),  # of that: until the supervisor relaunched
        "first_step_s": round(now - start, 4),  # the script's set-up, restore, one step
        "total_s": round(now - boundary, 4),
    }


def why_not_resizable(run: Run) -> str | None:
    """Rank 0, for validating a new ``workers`` (see Run._facts): what is missing, if any."""
    if run._binding is None:
        return ("the script has not called run.watch(model, optimizer): there would be "
                "nothing to checkpoint and resume")
    if run.paused:
        return "it is paused: resume it first (the resized job would start running)"
    spec = read_json(run.run_dir.job_file) or {}
    if "nproc" not in spec:
        return ("it was not started by hpi.launch or `hpinteract run`: nothing would "
                "start it again with another number of ranks")
    if node_count() > 1 and not nodes_shared():
        return ("its nodes do not share the run directory, so not every rank could read "
                "the resize's checkpoint: launch each node with the same HPINTERACT_HOME "
                "on shared storage")
    return None


def leave(run: Run, to: int, began: float, by: dict[str, Any]) -> None:
    """Every rank, at the resize boundary: close the control plane (rank 0's coordinator
    writes the checkpoint first), tell the supervisor, and leave the script."""
    run._end.finish(JobState.STARTING, None, together=False)
    if run.rank == 0:
        nodes = node_count()  # each node's supervisor starts its share of the new size
        write_record(run.run_dir, {"from": run.world_size, "to": to, "step": run.step_index,
                                   "nodes": nodes, "nproc": to // nodes,
                                   "boundary": began, "left": time.time(), **by})
    leave_together(run._group, run.topology)
    raise SystemExit(0)  # through the script's loops: what follows them is not run
