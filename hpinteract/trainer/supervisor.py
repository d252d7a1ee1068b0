"""The detached parent of a launched job: runs torchrun and records how the job ended.

Runs in: its own process session, started by ``hpi.launch`` (so the job outlives the
notebook that launched it). It calls torchrun's own entry point in-process, so the
elastic agent, rendezvous and per-rank logs are torchrun's, and torchrun's typed
``ChildFailedError`` tells which rank failed first and why. It then writes the final
state: the coordinator on rank 0 cannot, when rank 0 is the one that died. A job that was
resized (resize.py) ends its torchrun with every rank leaving cleanly and a record of the
new size; the supervisor then runs torchrun again with that many ranks.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args
from torch.distributed.run import run as torchrun

from ..protocol.failures import attempt_cause, attempts, cause, merge, read_rank_failures
from ..protocol.rundir import NODE_ENV, RunDir, atomic_write_json, read_json
from ..protocol.states import JobState
from .attempts import AttemptRecorder, job_step, seen_of
from .resize import Records, rdzv_id, relaunch_env
from .restart import RESIZED_ENV, SUPERVISED_ENV
from .runlog import RunLog, last_seq

LAST_CALL_S = 5


def standalone(job: dict[str, Any]) -> bool:
    """One node with no rendezvous endpoint: torchrun's ``--standalone``."""
    return str(job.get("nnodes", 1)) == "1" and not job.get("rdzv_endpoint")


def torchrun_argv(job: dict[str, Any], run_dir: RunDir) -> list[str]:
    argv = [
        "--nproc-per-node", str(job.get("nproc", 1)),
        "--log-dir", str(run_dir.logs_dir / "torchrun"),
        "--redirects", "3", "--tee", "3",
        "--max-restarts", str(job.get("max_restarts", 0)),
    ]
    nnodes = str(job.get("nnodes", 1))
    if standalone(job):
        argv.append("--standalone")
    else:
        argv += ["--nnodes", nnodes, "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", str(job["rdzv_endpoint"]),
                 "--rdzv-id", str(job.get("rdzv_id", run_dir.job_id))]
        if ":" in nnodes:
            # After a node is lost, the agents left wait this long for more to come before
            # they go on without it (torchrun's default, 30 s, is a long pause for a job).
            argv += ["--rdzv-conf", f"last_call_timeout={LAST_CALL_S}"]
    node = os.environ.get(NODE_ENV)
    if node:  # one run directory shared by the nodes: each agent's logs apart
        argv[argv.index("--log-dir") + 1] = str(run_dir.logs_dir / "torchrun" / node)
    # The script and its arguments reach the bootstrap through job.json, not argv: torchrun's
    # parser would take a script option such as --n for an abbreviation of its own options.
    return [*argv, "-m", "hpinteract.trainer.bootstrap"]


def append_event(run_dir: RunDir, event: dict[str, Any]) -> None:
    """Append to the events log once rank 0's coordinator (its writer) has gone."""
    seq = 1 + max(last_seq(run_dir.metrics_log), last_seq(run_dir.events_log))
    events = RunLog(run_dir.events_log)  # it ends a line torn by a crash before appending
    events.append({"seq": seq, "time": time.time(), **event})
    events.close()


def record_end(run_dir: RunDir, state: JobState, error: dict[str, Any] | None) -> None:
    """The job's terminal state: only the supervisor writes a failure (the ranks cannot
    tell a cause from its consequences)."""
    # A dead rank 0's, or another node's copy (nodes.py): nobody answers there any more.
    run_dir.connection.unlink(missing_ok=True)
    prev = read_json(run_dir.state_file) or {}
    if state == JobState.FINISHED and prev.get("state") == JobState.FINISHED.value:
        return  # rank 0 already recorded the clean end
    append_event(run_dir, {"kind": "state", "state": state.value, "source": "supervisor",
                           "error": error})
    atomic_write_json(run_dir.state_file, {**prev, "state": state.value, "error": error,
                                           "updated": time.time()})


def error_of(exc: ChildFailedError, run_dir: RunDir, recorder: AttemptRecorder
             ) -> dict[str, Any]:
    """The root cause of the failure torchrun raised, with the other ranks' failures as
    its consequences (protocol/failures.py)."""
    if recorder.last_failed is not None:
        found = attempt_cause(run_dir, recorder.last_failed)
        if found is not None:
            return found
    # Without the agent's record (a torch whose agent could not be wrapped): torchrun's
    # failures of the last attempt, and the ranks' own records of it.
    own = read_rank_failures(run_dir, max(attempts(run_dir), default=0))
    seen = {int(r): seen_of(f) for r, f in exc.failures.items()}
    merged = {r: merge(r, seen.get(r), own.get(r)) for r in sorted(set(seen) | set(own))}
    return cause(merged, job_step(run_dir), recorder.oom_killed())


def died_by_a_signal(error: dict[str, Any], after: str, run_dir: RunDir) -> None:
    """A rank that died by a signal once its work was safe: the job goes on (or stays
    finished), and an event says what happened."""
    append_event(run_dir, {"kind": "warning", "source": "supervisor", "error": error,
                           "message": f"rank {error['rank']} died {after}: "
                                      f"{error['message']}"})


def run_ranks(job: dict[str, Any], run_dir: RunDir, recorder: AttemptRecorder,
              records: Records) -> None:
    """One torchrun, to its end. A rank killed by a signal after rank 0 recorded a resize
    had left: every rank had agreed on the new size at the boundary, and rank 0 writes the
    record only once the resize checkpoint is on disk. What killed it is torch and gloo's
    abort at teardown (see distributed.leave_together), which must not fail the job; the
    resize goes on. (With torchrun restarts left, torchrun restarts the ranks instead: they
    resume from the resize checkpoint at the old size and leave for the new one again.)"""
    try:
        torchrun(parse_args(torchrun_argv(job, run_dir)))
    except ChildFailedError as exc:
        error = error_of(exc, run_dir, recorder)
        if records.fresh() is None or (error.get("exitcode") or 0) >= 0:
            raise
        died_by_a_signal(error, "after leaving for a resize", run_dir)


def relaunch(record: dict[str, Any], job: dict[str, Any], run_dir: RunDir) -> dict[str, Any]:
    """The job's spec for torchrun after a resize, written where every reader sees it. On
    several nodes each node's supervisor starts its share, at a new rendezvous; the nodes
    write the same spec."""
    # The file as it is now (the launcher added the supervisor's pid after we read it).
    job = {**(read_json(run_dir.job_file) or job), "nproc": int(record.get("nproc",
                                                                         record["to"]))}
    if not standalone(job):
        job["rdzv_id"] = rdzv_id(run_dir.job_id, record)
    atomic_write_json(run_dir.job_file, job)  # spec, jobs() and restarts see it
    os.environ[RESIZED_ENV] = relaunch_env(record)  # torchrun hands it to the ranks
    return job


def hold_rendezvous_store(job: dict[str, Any]) -> Any:
    """On the node that hosts the c10d rendezvous (its endpoint is this machine): its store
    for the supervisor's whole life. torchrun's agent creates the store as a multi-tenant
    server, which a later torchrun in this process (after a resize) would make again, and
    frees it whenever its last reference goes; another node's agent that connected to it
    in between would lose the connection. Holding one keeps the same server for every
    torchrun of the job. None where another process (a node on this machine that came
    first) hosts it, or on one node."""
    if standalone(job):
        return None
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.utils import (
        _matches_machine_hostname,
        parse_rendezvous_endpoint,
    )

    host, port = parse_rendezvous_endpoint(str(job["rdzv_endpoint"]), default_port=29400)
    if not _matches_machine_hostname(host):
        return None
    try:
        return TCPStore(host, port, is_master=True, multi_tenant=True,
                        timeout=timedelta(seconds=60), wait_for_workers=False)
    except (RuntimeError, ValueError, TimeoutError):  # the port is another process's
        return None


def main(run_path: str) -> int:
    run_dir = RunDir(run_path)
    job = read_json(run_dir.job_file)
    if job is None:
        print(f"no job.json in {run_path}", file=sys.stderr)
        return 2
    records = Records(run_dir, shared=bool(os.environ.get(NODE_ENV)))
    os.environ[SUPERVISED_ENV] = "1"  # torchrun hands it to the ranks
    if not standalone(job):
        # The agents' restart counts differ between nodes, so the ranks cannot key one
        # shared store by them (distributed.attempt_store): a store per rendezvous round.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    recorder = AttemptRecorder(run_dir)
    recorder.install()
    store = hold_rendezvous_store(job)  # noqa: F841 (held, never used)
    try:
        run_ranks(job, run_dir, recorder, records)
        # A resize: the ranks checkpointed and left; the job goes on with the new number.
        while (record := records.take()) is not None:
            job = relaunch(record, job, run_dir)
            run_ranks(job, run_dir, recorder, records)
    except ChildFailedError as exc:
        error = error_of(exc, run_dir, recorder)
        prev = read_json(run_dir.state_file) or {}
        if prev.get("state") == JobState.FINISHED.value and (error.get("exitcode") or 0) < 0:
            # Training had finished on every rank (rank 0 recorded it after the last step)
            # and a process died by a signal while exiting: keep the result.
            died_by_a_signal(error, "at exit after the job finished", run_dir)
            return 0
        record_end(run_dir, JobState.FAILED, error)
        return 1
    except BaseException as exc:  # rendezvous or launch failure: no rank ever ran
        record_end(run_dir, JobState.FAILED, {"rank": None, "message": repr(exc)})
        raise
    record_end(run_dir, JobState.FINISHED, None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
