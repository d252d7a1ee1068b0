"""A framework job's Run: what the Lightning and Hugging Face callbacks share.

Runs in: every rank's training thread, inside the framework's callback hooks. The
framework runs the loop; this turns its hooks into the calls a raw loop makes
(``hpi.init``, ``run.watch``, ``run.step``, ``run.log_eval``, ``run.finish``) and carries
hpinteract's part of the framework's checkpoints (the values in force and the change
history), so that a job resumed by the framework keeps them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..protocol.changes import Applied
from ..protocol.errors import ConfigError
from ..protocol.hparams import HParam
from ..trainer.checkpoint import Written
from ..trainer.commands import Command
from ..trainer.driven import Driven, release_at_epoch
from ..trainer.effect import OPTIMIZER_HPARAMS
from ..trainer.record import RESERVED, scalar
from ..trainer.run import Run
from ..trainer.start import init

log = logging.getLogger(__name__)

STATE_VERSION = 1  # of the dict a framework checkpoint carries (``FrameworkJob.state``)
# hpi.init's settings a callback passes on as they are.
SETTINGS = frozenset({"backend", "sync_every", "sync_budget", "ip", "policies"})


def check_settings(framework: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The callback's keyword arguments, or ConfigError naming one hpi.init does not take."""
    unknown = sorted(set(settings) - SETTINGS)
    if unknown:
        raise ConfigError(f"HPInteractCallback ({framework}) got unknown settings {unknown}: "
                          f"it takes hparams=, specs= and {sorted(SETTINGS)}")
    return dict(settings)


def fixed(value: Any, why: str, doc: str = "") -> HParam:
    """A value the framework reads only once: shown, and every change refused with ``why``."""
    return HParam(value, fixed=why, doc=doc)


@dataclass(frozen=True)
class Found:
    """What a callback found in the framework at the start of training (every rank)."""

    model: Any
    optimizer: Any
    scheduler: Any | None
    step: int  # optimizer steps already taken (a resumed run's)
    epoch: int
    values: dict[str, Any]  # hyper-parameters the framework holds (batch_size, clipping)
    specs: dict[str, HParam]  # their specs, where not the built-ins'


class WithRun:
    """What both callbacks offer the script: ``callback.run`` and ``callback.hp``."""

    _job: FrameworkJob

    @property
    def run(self) -> Run:
        """The Run while training (from the framework's train-start hook to its end)."""
        if self._job.run is None:
            raise ConfigError(f"the hpinteract run starts with the {self._job.framework} "
                              "training (its train-start hook)")
        return self._job.run

    @property
    def hp(self) -> Mapping[str, Any]:
        """The job's hyper-parameters now (the same on every rank); after training, the
        values it ended with."""
        return self._job.hp


class FrameworkJob:
    """One framework job's Run, as a callback drives it."""

    def __init__(self, framework: str, hparams: Mapping[str, Any] | None,
                 specs: Mapping[str, HParam] | None, settings: Mapping[str, Any]) -> None:
        self.framework = framework
        self.hparams = dict(hparams or {})
        self.specs = dict(specs or {})
        self.settings = check_settings(framework, settings)
        self.run: Run | None = None
        self._final: Mapping[str, Any] | None = None  # the values when training ended
        self._warned: set[str] = set()
        self._told = 0  # changes handed to the framework's loggers so far

    @property
    def hp(self) -> Mapping[str, Any]:
        """The job's hyper-parameters now; after training, those it ended with."""
        if self.run is not None:
            return self.run.hp
        if self._final is None:
            raise ConfigError(f"the hpinteract run starts with the {self.framework} "
                              "training (its train-start hook)")
        return self._final

    def fresh_changes(self) -> list[Applied]:
        """The changes applied since the last call, for the framework's own loggers and
        trackers: where its users already look."""
        run = self.run
        if run is None or run.driven is None:
            return []
        fresh = run.driven.changes[self._told:]
        self._told = len(run.driven.changes)
        return [Applied(int(c["applied_at_step"]), str(c.get("source") or "?"),
                        dict(c["values"]), dict(c.get("previous") or {}),
                        str(c["reason"]) if c.get("reason") else None)
                for c in fresh if c.get("applied_at_step") is not None]

    # ---- the start ----------------------------------------------------------------------
    def start(self, found: Found, driven: Driven,
              effect: Callable[[dict[str, Any]], None],
              saved: Mapping[str, Any] | None = None) -> Run:
        """Every rank, once the framework has made its process group, optimizer and
        scheduler (and loaded its checkpoint, when resuming): the Run, bound to them.
        ``effect(changed)`` sets the framework's own values (clipping, accumulation)."""
        clash = sorted(set(self.hparams) & set(found.specs))
        if clash:
            raise ConfigError(f"{clash} are the {self.framework} trainer's own settings: set "
                              "them there, not in HPInteractCallback(hparams=...)")
        run = init(hparams={**found.values, **self.hparams},
                   specs={**found.specs, **self.specs}, **self.settings)
        # The framework's launcher set the number of ranks: a resize, or a policy that
        # would resize (scale_workers), is refused with the reason.
        run.store.declare("workers", fixed(run.world_size, (
            f"a {self.framework} job keeps the number of ranks it was started with (its "
            "launcher and loaders are the framework's): checkpoint it and start it again "
            "with another number")))
        self.run = run
        run.step_index = found.step
        run.epoch = found.epoch
        run.store.add_effect(effect)
        run.watch(found.model, found.optimizer, found.scheduler)
        # From here each step's record waits for what the framework logs of the step just
        # after the hook that ends it (flush): the same record, never a second one a step.
        run.drive(driven)
        driven.changes.extend(self._restore(run, saved) if saved else [])
        return run

    def _restore(self, run: Run, saved: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A resumed run's values in force and history (from the framework's checkpoint).

        The optimizer's values (lr, momentum, weight decay) are not set again: the
        framework loaded the optimizer's and scheduler's states, which hold them, and a
        running schedule's lr is the one in force, not the value last set. The others
        (clipping, the batch, the user's own) are applied before the first step."""
        if int(saved.get("version", 0)) != STATE_VERSION:
            raise ConfigError(f"the checkpoint's hpinteract state is version "
                              f"{saved.get('version')!r}, this hpinteract reads "
                              f"{STATE_VERSION}")
        specs = run.store.specs
        values = {n: v for n, v in dict(saved.get("hparams") or {}).items()
                  if n in specs and n not in OPTIMIZER_HPARAMS and n != "workers"
                  and not specs[n].fixed and run.hp.get(n) != v}
        if values:
            run.store.apply(run.store.validate(values), run.step_index)
        changes = [dict(c) for c in saved.get("changes") or []]
        if run._coord is not None:
            run._coord.post("event", {
                "kind": "resumed", "source": self.framework, "step": run.step_index,
                "from_job": saved.get("job_id"), "from_step": saved.get("step"),
                "values": values, "changes": len(changes)})
            for c in changes:  # the history, in this job's log too
                run._coord.post("event", {"kind": "change", "status": "carried",
                                          "from_job": saved.get("job_id"), **c})
        return changes

    # ---- each step ----------------------------------------------------------------------
    def metrics(self, raw: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """The user's logged values for a record: numbers and scalar tensors only, a name
        hpinteract writes itself renamed ``<prefix>_<name>`` (said once in the log)."""
        out: dict[str, Any] = {}
        for name, value in raw.items():
            if value is None or isinstance(value, str):
                continue
            if getattr(value, "numel", None) is not None and value.numel() != 1:
                continue
            if name in RESERVED or name.startswith(("step_time_r", "data_time_r")):
                new = f"{prefix}_{name}"
                if name not in self._warned:
                    self._warned.add(name)
                    log.warning("hpinteract: the %s metric %r is recorded as %r (%r is "
                                "hpinteract's own)", self.framework, name, new, name)
                name = new
            # A CPU tensor read now (the framework may update it in place), a device one
            # copied without a sync (record.scalar).
            out[name] = scalar(name, value)
        return out

    def step(self, loss: Any, metrics: Mapping[str, Any]) -> bool:
        """After one optimizer step (every rank): record, apply what is due, hold while
        paused. True when the job was stopped: the framework should end training."""
        run = self.run
        assert run is not None
        run.step(loss, **metrics)
        return run.should_stop

    def flush(self, extra: Mapping[str, Any] | None = None) -> None:
        """Rank 0: post the held record of the last step, with what the framework logged
        of it (a no-op on the other ranks, and when nothing is held)."""
        run = self.run
        if run is None or run.held_record is None:
            return
        rec, run.held_record = run.held_record, None
        if extra:
            rec.update(extra)
        if run._coord is not None:
            # As run.step posts a raw loop's: the coordinator collects records on its
            # 50 ms cycle. Waking it for each one cost a syscall and a thread switch on
            # rank 0 every step (about 1 % of a 9 ms step on 2 busy cores).
            run._coord.post("metric", rec, wake=False)

    def epoch_boundary(self, epoch: int) -> None:
        """Every rank, between two epochs: the changes held for it apply now."""
        run = self.run
        assert run is not None
        run.epoch = epoch
        release_at_epoch(run)

    # ---- checkpoints --------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """hpinteract's part of a framework checkpoint (every rank alike)."""
        run = self.run
        assert run is not None and run.driven is not None
        return {"version": STATE_VERSION, "job_id": run.run_dir.job_id,
                "step": run.step_index, "hparams": dict(run.hp),
                "last_changed": dict(run.store.last_changed),
                "changes": list(run.driven.changes)}

    def written(self, cmd: Command | None, step: int, path: str | Path, began: float,
                error: str | None = None) -> None:
        """Rank 0: answer a checkpoint request once the framework's file is on disk."""
        run = self.run
        if run is None or run._coord is None or cmd is None:
            return
        p = Path(path)
        size = sum(f.stat().st_size for f in ([p] if p.is_file() else p.rglob("*"))
                   if f.is_file()) if p.exists() else 0
        run._coord.post("written", Written(cmd, step, None if error else p, error,
                                           time.time() - began, size))

    # ---- the end ------------------------------------------------------------------------
    def finish(self) -> None:
        """Every rank, when the framework's training ends (normally or stopped): changes
        still held for an epoch boundary apply at this last one, then the job finishes."""
        run = self.run
        if run is None:
            return
        self.flush()
        if run.driven is not None:  # every rank: only rank 0 knows what is held
            release_at_epoch(run)
        run.finish()
        self._final = MappingProxyType(dict(run.hp))
        self.run = None
