"""Resuming a job from one of its checkpoints (asked for, or after torchrun restarted its
workers): what every rank loads, and the logs made to continue from the checkpoint's step.

Runs in: every rank's training thread, inside ``hpi.init`` (``load_resume``) and
``Run.watch`` (``restore``); rank 0 alone, before its coordinator opens the logs
(``rewind_logs``). The launcher (``hpi.launch(resume=...)``) names the checkpoint in the
job's spec; the job continues in the same run directory with its steps counted on.

Order matters where users of other tools get hurt: the model, optimizer and scheduler
states are loaded first, and the effective hyper-parameters (the checkpoint's, then any new
launch overrides) are pushed into the optimizer after that, so a resumed job never falls
back to the learning rate that was in the optimizer's saved state or in the script.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..protocol.changes import to_redo
from ..protocol.columns import ColumnWriter
from ..protocol.rundir import RunDir, read_checkpoint_index, read_json
from .checkpoint import load, unwrap
from .resize import restarted
from .restart import attempt, lost_nodes, previous_failure, resized

SUPERSEDED = "metrics.superseded.jsonl"  # steps run after the checkpoint, set aside


@dataclass
class Resume:
    path: Path
    state: dict[str, Any]
    own: bool = False  # the job's own newest checkpoint, after a restart: overrides in it

    @property
    def saved_ids(self) -> set[str]:
        """The changes the checkpoint holds already."""
        return {str(c.get("id")) for c in self.state.get("changes") or []}

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def hparams(self) -> dict[str, Any]:
        return dict(self.state.get("hparams") or {})

    def epoch_and_position(self, size: int | None = None) -> tuple[int, int]:
        """Where the data continues. A checkpoint taken as an epoch ran out is the start
        of the next one, so the epoch is not run a second time."""
        where = self.state.get("loader") or {}
        epoch = int(where.get("epoch", self.state.get("epoch", 0)))
        position = int(where.get("position", 0))
        if size is not None and position >= size:
            return epoch + 1, 0
        return epoch, position


def load_resume(run_dir: RunDir, spec: dict[str, Any]) -> Resume | None:
    """The checkpoint this run continues from: after an automatic restart or a resize the
    job's newest one (the index is written atomically, so every rank reads the same);
    otherwise the one the launcher named (``hpi.launch(resume=...)``), if any."""
    if attempt() > 0 or resized() is not None:
        index = read_checkpoint_index(run_dir.checkpoints_dir)
        if index:
            path = run_dir.checkpoints_dir / index[-1]["file"]
            return Resume(path, load(path), own=True)
        # None of its own yet: where this job started from (a resume's or a fork's), or
        # the beginning.
    what = spec.get("resume")
    if not what:
        return None
    path = Path(what["checkpoint"])
    return Resume(path, load(path))


def history_to_redo(run_dir: RunDir, resume: Resume,
                    overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """Rank 0, before ``rewind_logs``: the changes made after the checkpoint that the
    resumed run makes again at their steps (names given anew at this launch excepted)."""
    events = []
    try:
        with open(run_dir.events_log, "rb") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue  # a torn last line
    except FileNotFoundError:
        pass
    return to_redo(events, resume.step, resume.saved_ids, overrides)


def restore(resume: Resume, model: Any, optimizer: Any, scheduler: Any, rank: int) -> None:
    """Load the saved states into the script's objects (every rank: under DDP they all hold
    the same parameters and optimizer state)."""
    s = resume.state
    unwrap(model).load_state_dict(s["model"])
    if optimizer is not None and s.get("optimizer") is not None:
        optimizer.load_state_dict(s["optimizer"])
    if scheduler is not None and s.get("scheduler") is not None:
        scheduler.load_state_dict(s["scheduler"])
    rng = s.get("rng") or {}
    if rank == 0 and rng:  # the generators are rank 0's: the other ranks keep their own
        torch.set_rng_state(rng["torch"])
        version, internal, gauss = rng["python"]
        random.setstate((version, tuple(internal), gauss))
        n = rng["numpy"]
        np.random.set_state((n["bit_generator"], n["key"].numpy().astype(np.uint32), n["pos"],
                             n["has_gauss"], n["gauss"]))
        cuda = rng.get("cuda") or []
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def rewind_logs(run_dir: RunDir, resume: Resume | None,
                spec: dict[str, Any]) -> dict[str, Any]:
    """Make the metrics log end before the checkpoint's step (rank 0, before the
    coordinator starts), and record the resume as an event.

    Steps that ran after the checkpoint are run again: their old records are moved to
    ``metrics.superseded.jsonl`` (kept, never deleted), so the log has each step once.
    The log is rewritten to a temporary file and renamed into place; the columnar copy is
    rebuilt from it. Sequence numbers go on from the highest ever written, so a client that
    saw the old records still sees every new one.
    """
    step = resume.step if resume is not None else 0
    kept: list[bytes] = []
    dropped: list[bytes] = []
    top_seq, last_step = 0, -1
    try:
        with open(run_dir.metrics_log, "rb") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn last line of a job that was killed
        top_seq = max(top_seq, int(rec.get("seq", 0)))
        s = int(rec.get("step", -1))
        last_step = max(last_step, s)
        (kept if s < step else dropped).append(line)
    if dropped:
        with open(run_dir.path / SUPERSEDED, "ab") as f:
            f.write(b"".join(line + b"\n" for line in dropped))
    tmp = run_dir.metrics_log.with_name(f".{run_dir.metrics_log.name}.resume.tmp")
    with open(tmp, "wb") as f:
        f.write(b"".join(line + b"\n" for line in kept))
    os.replace(tmp, run_dir.metrics_log)
    shutil.rmtree(run_dir.columns_dir, ignore_errors=True)
    columns = ColumnWriter(run_dir.columns_dir)
    for line in kept:
        columns.add(json.loads(line))
    columns.close()
    try:
        with open(run_dir.events_log, "rb") as f:
            for line in f:
                try:
                    top_seq = max(top_seq, int(json.loads(line).get("seq", 0)))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    restarts = attempt()
    event = {"seq": top_seq + 1, "time": time.time(),
             "kind": "restart" if restarts else "resume", "step": step,
             "checkpoint": str(resume.path) if resume is not None else None,
             "steps_lost": max(0, last_step + 1 - step),
             "source": "torchrun" if restarts else "launch"}
    if not restarts and (record := resized()) is not None:
        restarted()  # the resize's latency is counted from here (resize.done_event)
        event.update(kind="resize", status="restarted", source="resize",
                     **{"from": record.get("from"), "to": record.get("to")})
    elif restarts:  # which restart, and why: the last attempt's failure records
        event.update(restart=restarts, **previous_failure(run_dir, restarts - 1))
        before = (read_json(run_dir.state_file) or {}).get("world_size")
        now = int(os.environ.get("WORLD_SIZE", "1"))
        if isinstance(before, int) and before != now:  # a node was lost, or came back
            event.update(world_size=now, previous_world_size=before,
                         nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")))
            per = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
            lost = lost_nodes(run_dir, restarts - 1, (before - now) // per) \
                if now < before and event.get("failed_kind") == "lost_peer" else []
            if lost:  # what the survivors saw was a consequence: name the node
                event["lost_nodes"] = ", ".join(lost)
                event["error"] = (f"node {event['lost_nodes']} was lost (no record from its "
                                  "agent or ranks: the machine, or every process of it, went "
                                  f"away); then {event['error']}")
    elif spec.get("parent") and not spec.get("resumes"):  # a fork's first start
        event.update(kind="fork", source="fork", parent=spec["parent"]["job_id"],
                     asked=spec["parent"].get("asked"))
    with open(run_dir.events_log, "a") as f:
        f.write(json.dumps(event) + "\n")
    return event
