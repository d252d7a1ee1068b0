"""``Run``: the training script's handle on hpinteract (``hpi.init``, in start.py,
makes it).

Runs in: every rank's training thread. Rank 0 also starts the coordinator (a process of
its own, or a thread: control_process.py). The hot
path is ``Run.step``: on rank 0 it puts one dict on a queue; on every rank it decrements a
counter, and only at a sync point joins the one small collective of `sync`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import IO, Any

from ..protocol.errors import ConfigError
from ..protocol.hparams import BUILTINS, HParam
from ..protocol.rundir import RunDir
from ..protocol.states import JobState
from .averaging import SyncControl
from .batching import plan_of
from .boundary import Boundary
from .control_process import ControlPlane, control_plane
from .declare import declare
from .distributed import Topology
from .driven import Driven
from .effect import OPTIMIZER_HPARAMS, OptimizerBinding
from .ending import Ending
from .loader import ONE, HpLoader, Micro
from .monitors import GNSMonitor
from .nodes import node_count, share_connection
from .rank_times import RankTimes
from .record import step_record, user_metrics
from .replay import ReplaySchedule
from .resize import done_event, why_not_resizable
from .restart import attempt, resized
from .resume import Resume, restore
from .sync import StepSync
from .watchdog import Watchdog

log = logging.getLogger(__name__)


class Run:
    """What a training script uses: ``hp``, ``watch``, ``dataloader``, ``epochs``,
    ``backward``, ``step`` and ``log_eval``."""

    def __init__(
        self, topo: Topology, group: Any, sync: StepSync, run_dir: RunDir,
        hparams: dict[str, Any], specs: dict[str, HParam], overrides: dict[str, Any], ip: str,
        policies: list[Any], resume: Resume | None = None,
        replay: ReplaySchedule | None = None,
    ) -> None:
        self.topology = topo
        self.rank, self.world_size, self.device = topo.rank, topo.world_size, topo.device
        self.run_dir = run_dir
        self._group, self._sync = group, sync
        self._sync_control = SyncControl(self.world_size)
        self.driven: Driven | None = None  # a framework's (integrations): see drive()
        d = declare(hparams, specs, overrides, resume.hparams if resume else {},
                    self.world_size, topo.devices, resizable=lambda: why_not_resizable(self),
                    averaging=lambda: self._sync_control.why_not(self._binding),
                    batch_step=lambda: self.driven.batch_step if self.driven else None)
        self.store, self._explicit, self._carried = d.store, d.explicit, d.carried
        self._resume = resume
        self._resume_data = resume  # taken by the first loader
        self.hp: Mapping[str, Any] = self.store.view
        # Rank 0, a framework's run: the step's record, kept for the integration, which
        # adds what the framework logs of the step just after it and posts it.
        self.held_record: dict[str, Any] | None = None
        self.micro_batch, self.accumulation = (
            plan_of(self.hp, self.world_size) if "batch_size" in self.hp else (0, 1))
        self.store.add_effect(self._replan)
        self.epoch = 0
        self.step_index = 0  # index of the next optimizer step
        if resume is not None:  # steps are counted on from the checkpoint
            self.step_index, self.store.last_changed = resume.step, dict(
                resume.state.get("last_changed") or {})
            self.epoch = resume.epoch_and_position()[0]
        self.total_epochs: int | None = None
        self.should_stop = False
        self.paused = False
        self.model: Any = None
        self.optimizer: Any = None
        self._binding: OptimizerBinding | None = None
        self._loader: HpLoader | None = None
        self._micro: Micro = ONE  # where the loader's last micro-batch sits in its step
        self._step_ready = False  # run.backward saw the step's last micro-batch
        self._gns: GNSMonitor | None = None
        self._times = RankTimes(group, self.world_size, self.rank)
        self._rank_metrics: dict[str, Any] = {}  # rank 0: the last gather, for the next record
        self._boundary = Boundary(self)
        self._replay = replay if replay is not None else ReplaySchedule(None)
        replaced = [type(p[0] if isinstance(p, tuple) else p).__name__ for p in policies]
        if self._replay:  # their decisions are in the schedule: running them would act twice
            policies = []
        self._running = False  # rank 0: RUNNING recorded
        # Under torchrun, its agent outlives a restart of the ranks: a client watches it
        # (client/liveness.py), not rank 0's process, where no supervisor is.
        self._agent_pid = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        self._last_t = time.perf_counter()
        self._batch_t = self._last_t
        self._rank_log: IO[str] = open(run_dir.rank_log(self.rank), "a", buffering=1)  # noqa: SIM115
        self._coord: ControlPlane | None = None
        if self.rank == 0:
            self._coord = control_plane(run_dir, store=self.store, world_size=self.world_size,
                                        ip=ip, policies=policies,
                                        resumed=resume.state if resume else None,
                                        facts=self._facts)  # started
            if self._replay:
                self._coord.post("event", {
                    "kind": "replay", "of": self._replay.of, "source": "launch",
                    "step": self.step_index, "changes": self._replay.count,
                    "policies_not_started": replaced})
            self._post_status()
        if node_count() > 1:  # every rank: the coordinator's address for every node
            share_connection(sync, self.rank, topo.local_rank, run_dir)
        self._watch = Watchdog(self)  # hang_timeout
        self._end = Ending(self)  # the excepthook, atexit and SIGTERM handlers

    # ---- set-up ---------------------------------------------------------------------------
    def watch(self, model: Any, optimizer: Any, scheduler: Any | None = None) -> Any:
        """Bind lr/momentum/weight_decay to the optimizer's param groups; returns ``model``.

        A value given to init or launch is pushed into the optimizer; one the script did not
        declare is read from it, so the optimizer's constructor arguments stay the default.
        """
        binding = OptimizerBinding(optimizer, scheduler)
        supported = binding.supported()
        for name in OPTIMIZER_HPARAMS:
            if name in self._explicit - self._carried and name not in supported:
                raise ConfigError(f"{type(optimizer).__name__} has no {name!r} to bind")
        current = binding.read()
        for name in supported:
            if name not in self.store.specs:
                spec = BUILTINS[name].with_default(current[name], name)
                self.store.declare(name, replace(spec, fixed=binding.why_fixed(name)))
        binding.apply({n: self.store.view[n] for n in supported if n in self._explicit})
        if self._resume is not None:
            restore(self._resume, model, optimizer, scheduler, self.rank)
            # After the saved states, whose param groups hold the lr of back then: the
            # effective values win, so a resumed job never falls back to an old lr.
            binding.apply({n: self.store.view[n] for n in supported})
        self.store.add_effect(binding.apply)
        if self._sync_control.watch(model, optimizer, str(self.hp["sync"])):
            self.store.add_effect(self._sync_control.on_change)
        self._binding, self.model, self.optimizer = binding, model, optimizer
        self._gns = GNSMonitor(model, [p for p in model.parameters() if p.requires_grad],
                               self.world_size, self.rank)
        self._gns.arm(self.step_index, self._sync_control.gns_every(self.hp),
                           self.accumulation)
        self._replay_due()  # a resumed run's changes of its first step
        self._post_status()
        return model

    def dataloader(self, dataset: Any, **options: Any) -> HpLoader:
        """A loader of ``batch_size / world_size`` samples per rank and step (see loader)."""
        if "batch_size" not in self.store.specs:
            raise ConfigError("declare batch_size (the global batch) in hpi.init(hparams=...)")
        self._loader = HpLoader(self, dataset, **options)
        return self._loader

    def _loader_start(self, size: int) -> tuple[int, int] | None:
        """For the first loader of a resumed job: the epoch and position it continues at."""
        resume, self._resume_data = self._resume_data, None
        return resume.epoch_and_position(size) if resume is not None else None

    def epochs(self, n: int) -> Iterator[int]:
        """Epoch indices 0..n-1; ends early, on every rank at once, when the job is stopped."""
        self.total_epochs = n
        self._post_status()
        for e in range(self.epoch, n):
            if self.should_stop:
                return
            self.epoch = e
            yield e

    # ---- the hot path -------------------------------------------------------------------------
    def _batch_started(self, where: Micro = ONE) -> None:
        if where.index == 0:
            self._batch_t = time.perf_counter()
        self._micro = where

    def _replan(self, changed: dict[str, Any]) -> None:
        if "batch_size" in changed or "micro_batch" in changed:
            self.micro_batch, self.accumulation = (
                plan_of(self.hp, self.world_size) if self.driven is None
                else self.driven.plan(self.hp))

    def drive(self, driven: Driven) -> None:
        """A framework runs the loop (an integration calls this, on every rank, before the
        first step): the batch plan, checkpoints and epoch-boundary changes are its."""
        self.driven = driven
        self.micro_batch, self.accumulation = driven.plan(self.hp)
        self._post_status()

    def backward(self, loss: Any) -> bool:
        """``loss.backward()`` for one micro-batch; True when the step's global batch is
        complete and the optimizer should step (always True without accumulation).

        The loss (a mean over the micro-batch) is weighted by the micro-batch's share of the
        rank's samples, and DDP all-reduces only after the last micro-batch, so the gradient
        is the mean over the global batch whatever the split.
        """
        where = self._micro
        last = where.index == where.count - 1
        if where.count > 1:
            loss = loss * where.weight
        if not last and hasattr(self.model, "no_sync"):
            with self.model.no_sync():
                loss.backward()
        else:
            loss.backward()
        if self._gns is not None and self._gns.measuring:
            self._gns.after_backward(where.index, where.count, where.weight)
        self._step_ready = last
        return last

    def log_eval(self, **metrics: Any) -> None:
        """Record evaluation metrics (e.g. ``val_loss=..., val_acc=...``) at the current step;
        policies such as ReduceOnPlateau and EarlyStopping read them."""
        if self._coord is None:
            return
        rec = {"step": max(self.step_index - 1, 0), "epoch": self.epoch, "time": time.time(),
               "eval": True, **user_metrics(metrics, also=frozenset({"loss"}))}
        self._coord.post("metric", rec)

    def step(self, loss: Any = None, **metrics: Any) -> None:
        """Call once after each optimizer step: publishes metrics, applies pending changes,
        holds while paused and marks the loop to end when stopped."""
        now = time.perf_counter()
        dt = now - self._last_t
        self._last_t = self._watch.beat = now
        data_time = max(0.0, self._batch_t - (now - dt))
        if self.accumulation > 1 and self.driven is None:
            self._check_accumulation()
        self._times.add(dt, data_time)
        noise = None
        if self._gns is not None and self._gns.measuring:  # every rank takes part
            noise = self._gns.step_done(self.step_index, int(self.hp.get("batch_size", 0)),
                                        self.micro_batch,
                                        self.accumulation, float(self.hp["gns_smoothing"]))
        if self._coord is not None:
            progress = None
            if self._loader is not None and self.total_epochs:
                frac = self._loader.position / self._loader.size
                progress = min(1.0, (self.epoch + frac) / self.total_epochs)
            elif self.driven is not None and self.driven.progress is not None:
                progress = self.driven.progress()
            rec = step_record(
                self.step_index, self.epoch, dt, data_time, loss, metrics,
                self._lr_used(),
                self.hp.get("batch_size"), progress)
            rec.update(noise or ())
            if self._rank_metrics:
                rec.update(self._rank_metrics)
                self._rank_metrics = {}
            if self.driven is not None:
                self.held_record = rec
            else:
                self._coord.post("metric", rec, wake=False)
            self._sync.observe_step(dt)
            if not self._running:  # this run's first step (a resumed job's is not step 0)
                self._running = True
                self._coord.post("state", JobState.RUNNING, self.step_index, "job")
                if (record := resized()) is not None and attempt() == 0:
                    self._coord.post("event", done_event(record, self.step_index,
                                                         self.world_size))
        if self._sync_control.averaging:
            self._sync_control.after_step(self.step_index, int(self.hp["averaging_period"]))
        self.step_index += 1
        if self._gns is not None:
            self._gns.arm(self.step_index, self._sync_control.gns_every(self.hp),
                           self.accumulation)
        self._replay_due()  # where a sync point applied them the first time
        if self._sync.due():
            self._at_sync_point()
            self.hold_while_paused()

    def between_steps(self) -> AbstractContextManager[None]:
        """``with run.between_steps(): evaluate()``: work between two steps that is not
        training (an evaluation, a long save), which the hang watchdog does not count."""
        return self._watch.between_steps()

    def hold_while_paused(self) -> None:
        """After a sync point (every rank): wait, syncing, until resumed or stopped."""
        if self.paused:
            if self.driven is not None and self.driven.flush is not None:
                self.driven.flush()  # the held record of the last step: seen while paused
            while self.paused and not self.should_stop:
                if self._coord is not None:
                    self._coord.command_ready.wait(0.1)
                self._sync_now()
            self._last_t = time.perf_counter()  # a pause is not step time

    def _lr_used(self) -> float | None:
        """The step's lr: a framework's scheduler has already set the next step's when
        run.step is called, so its integration notes the one the optimizer used."""
        if self._binding is None:
            return None
        if self.driven is not None and self.driven.lr_used is not None:
            return self.driven.lr_used
        return float(self.optimizer.param_groups[0]["lr"])

    def _replay_due(self) -> None:
        if self._replay.next_step <= self.step_index:  # one compare per step otherwise
            self._boundary.replay(self._replay.due(self.step_index))

    def _check_accumulation(self) -> None:
        if self._loader is None:
            raise ConfigError(f"micro_batch={self.micro_batch} makes each step "
                              f"{self.accumulation} micro-batches: use run.dataloader()")
        if not self._step_ready:
            raise ConfigError(
                f"each step is {self.accumulation} micro-batches (batch_size="
                f"{self.hp['batch_size']}, micro_batch={self.micro_batch}, "
                f"{self.world_size} rank(s)): call run.backward(loss) for each and "
                "optimizer.step() and run.step() only when it returns True")
        self._step_ready = False

    # ---- step boundary ---------------------------------------------------------------------
    def _at_sync_point(self) -> None:
        # Every rank runs the same branches here: they depend only on the step index and on
        # values that change at sync points, so the collectives match.
        if self._times.due(self.step_index, int(self.hp["monitor_ranks"])):
            gathered = self._times.gather(self.step_index)
            if self.rank == 0 and self.world_size > 1:
                self._rank_metrics = gathered
        self._boundary.snapshot()
        self._sync_now()

    def _sync_now(self) -> None:
        self._boundary.sync()

    @property
    def _scheduler(self) -> Any:
        return self._binding.scheduler if self._binding is not None else None

    def _noise_scale(self) -> float | None:
        return self._gns.estimator.simple() if self._gns is not None else None

    def _facts(self) -> dict[str, Any]:
        """What validating a change reads of this run besides its values (rank 0)."""
        return {"resize": why_not_resizable(self),
                "averaging": self._sync_control.why_not(self._binding),
                "batch_step": self.driven.batch_step if self.driven is not None else None}

    def _post_status(self, wake: bool = True) -> None:
        if self._coord is None:
            return
        self._coord.post("status", {
            "hparams": dict(self.store.view),
            "specs": {n: s.to_wire() for n, s in self.store.specs.items()},
            "last_changed": dict(self.store.last_changed),
            "epochs": self.total_epochs,
            "watched": self._binding is not None,
            "plan": {"micro_batch": self.micro_batch, "accumulation": self.accumulation},
            "restarts": attempt(),
            "agent_pid": self._agent_pid,
            "framework": self.driven.name if self.driven is not None else None,
            # How soon a change can apply: the coordinator lets requests wait for each other
            # for a share of it (requests.REQUEST_GATE_SHARE).
            "sync_s": round(self._sync.seconds_between(), 4),
        }, wake=wake)

    # ---- the end (ending.py) -------------------------------------------------------------
    def finish(self) -> None:
        """Record that the job finished and close the control plane; call it on every rank
        (at exit it is done for you, without the final rendezvous of the ranks)."""
        self._end.finish(JobState.FINISHED, None, together=True)
