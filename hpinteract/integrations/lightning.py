"""PyTorch Lightning: ``Trainer(callbacks=[HPInteractCallback()])`` is the whole change.

Runs in: every rank's training thread, in Lightning's hooks (under torchrun, hpi.launch,
Lightning's own launcher or one process). The callback is a Callback of both Lightning
packages (``lightning`` and ``pytorch_lightning``), whichever the script's Trainer is.

What is live, and where it takes effect (docs/frameworks/lightning.md):
- at the next optimizer step: lr (every param group, ratios kept, a running scheduler
  continued from it: trainer/effect.py), momentum (Adam's beta1), weight_decay,
  ``gradient_clip_val`` (``Trainer.gradient_clip_val``, read at every step) and the
  user's own hyper-parameters;
- at the next epoch: ``batch_size``, the global batch (per-rank batch x
  ``accumulate_grad_batches`` x ranks), through the accumulation, which Lightning reads at
  every batch but counts from the epoch's start.
Stop sets ``trainer.should_stop`` on every rank at the same step; checkpoint-now is
``trainer.save_checkpoint`` (every rank, as Lightning needs), whose file carries
hpinteract's state as this callback's state: ``Trainer.fit(ckpt_path=...)`` resumes with
the values in force and the change history.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from ..protocol.errors import ConfigError
from ..protocol.hparams import HParam
from ..trainer.commands import Command
from ..trainer.driven import Driven
from .adapter import Found, FrameworkJob, WithRun, fixed
from .reporters import TEXT_TAG, numbers, text

_BASES: list[type] = []
try:
    from lightning.pytorch import Callback as _LCallback

    _BASES.append(_LCallback)
except ImportError:  # pragma: no cover - either package will do
    pass
try:
    from pytorch_lightning import Callback as _PLCallback

    if _PLCallback not in _BASES:
        _BASES.append(_PLCallback)
except ImportError:  # pragma: no cover
    pass
if not _BASES:  # pragma: no cover
    raise ImportError("hpinteract.integrations.lightning needs Lightning 2.x: "
                      "pip install 'hpinteract[lightning]'")

WHY_SYNC = ("Lightning's strategy owns the gradient all-reduce: choose the strategy in the "
            "Trainer")
WHY_EVERY = ("Lightning writes periodic checkpoints itself: ModelCheckpoint("
             "every_n_train_steps=N); job.checkpoint() writes one now")


def _per_rank_batch(loader: Any) -> int | None:
    """Samples per rank and forward of the train loader, if it says (a plain DataLoader)."""
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return int(size) if isinstance(size, int) and size > 0 else None


class HPInteractCallback(WithRun, *_BASES):  # type: ignore[misc]
    """Live hyper-parameters, metrics, pause/stop and checkpoints for a Lightning fit.

    ``hparams`` and ``specs`` are the job's own hyper-parameters, as in ``hpi.init``
    (read them in the module with ``callback.hp[name]``); the other keyword arguments are
    hpi.init's settings (``sync_every``, ``policies``, ...)."""

    def __init__(self, hparams: Mapping[str, Any] | None = None,
                 specs: Mapping[str, HParam] | None = None, **settings: Any) -> None:
        super().__init__()
        self._job = FrameworkJob("lightning", hparams, specs, settings)
        self._saved: dict[str, Any] | None = None  # from the checkpoint being resumed
        self._seen_step = -1
        self._micro = 0  # micro-batches of the current optimizer step, backwards done
        self._trainer: Any = None

    # ---- the start ----------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Optimizers, schedulers and a resumed checkpoint are in place: start the run."""
        if not trainer.optimizers:
            raise ConfigError("hpinteract binds the optimizer: configure_optimizers returned "
                              "none")
        if len(trainer.optimizers) > 1:
            raise ConfigError(f"hpinteract binds one optimizer; this module has "
                              f"{len(trainer.optimizers)} (manual optimization)")
        opt = trainer.optimizers[0]
        sched = next((c.scheduler for c in trainer.lr_scheduler_configs
                      if getattr(c.scheduler, "optimizer", None) is opt), None)
        world = int(trainer.world_size)
        per_rank = _per_rank_batch(trainer.train_dataloader)
        clip = trainer.gradient_clip_val
        values: dict[str, Any] = {}
        specs: dict[str, HParam] = {
            "gradient_clip_val": HParam(float(clip or 0.0), low=0.0, doc=(
                "gradient clipping (Trainer.gradient_clip_val, by "
                f"{trainer.gradient_clip_algorithm or 'norm'}; 0: off)")),
            "sync": fixed("ssgd", WHY_SYNC), "checkpoint_every": fixed(0, WHY_EVERY)}
        if per_rank is not None:
            values["batch_size"] = per_rank * int(trainer.accumulate_grad_batches) * world
        self._trainer = trainer
        self._seen_step = int(trainer.global_step)
        self._job.start(
            Found(pl_module, opt, sched, int(trainer.global_step), int(trainer.current_epoch),
                  values, specs),
            self._driven(trainer, per_rank, world), self._effect, self._saved)

    def _driven(self, trainer: Any, per_rank: int | None, world: int) -> Driven:
        def plan(hp: Mapping[str, Any]) -> tuple[int, int]:
            if per_rank is None:
                return 0, int(trainer.accumulate_grad_batches)
            return per_rank, max(1, int(hp["batch_size"]) // (per_rank * world))

        totals: dict[int, float] = {}  # by accumulate_grad_batches, which changes it

        def progress() -> float | None:
            # estimated_stepping_batches walks the loaders and limits each time it is
            # read: once per accumulation (they change only with it) keeps it off the step.
            accumulate = int(trainer.accumulate_grad_batches)
            if accumulate not in totals:
                totals[accumulate] = float(trainer.estimated_stepping_batches or 0)
            total = totals[accumulate]
            return min(1.0, trainer.global_step / total) if total and total != float(
                "inf") else None

        step = None if per_rank is None else {"unit": per_rank * world, "why": (
            f"Lightning's train loader gives each of the {world} rank(s) {per_rank} samples "
            "per forward, and accumulate_grad_batches makes the rest")}
        return Driven("lightning", plan, self._save, frozenset({"batch_size"}), progress,
                      step, flush=lambda: self._job.flush(self._logged(trainer, now=True)))

    def _logged(self, trainer: Any, now: bool = False) -> dict[str, Any]:
        """What the module logged of the last step (self.log), evaluations left out.

        Lightning gathers it just after on_train_batch_end: the step's record waits for
        it (FrameworkJob.flush), read from the dict Lightning filled then. The public
        ``trainer.callback_metrics`` computes that dict again (0.06 ms a step here), so it
        is read only where nothing newer is coming (``now``: a pause, the end)."""
        raw = None if now else getattr(getattr(trainer, "_logger_connector", None),
                                       "_callback_metrics", None)
        if raw is None:
            raw = trainer.callback_metrics
        return self._job.metrics({k: v for k, v in raw.items()
                                  if not k.startswith(("val", "test"))
                                  and not k.endswith("_epoch")}, "pl")

    def _effect(self, changed: dict[str, Any]) -> None:
        """Every rank: the values Lightning reads from the Trainer."""
        trainer = self._trainer
        if "gradient_clip_val" in changed:
            trainer.gradient_clip_val = float(changed["gradient_clip_val"]) or None
        if "batch_size" in changed:  # only at an epoch boundary (Driven.at_epoch)
            trainer.accumulate_grad_batches = self.run.accumulation

    # ---- each step ----------------------------------------------------------------------
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        """The first micro-batch of a step: its data has arrived (the data-wait time)."""
        if self._job.run is not None and self._micro == 0:
            self._job.flush(self._logged(trainer))
            self._job.run._batch_started()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """Before the scheduler's step: the lr this step uses, for its record."""
        run = self._job.run
        if run is not None and run.driven is not None:
            run.driven.lr_used = float(optimizer.param_groups[0]["lr"])

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        """A micro-batch's gradients (the noise-scale monitor's small batch)."""
        run = self._job.run
        if run is None:
            return
        gns = run._gns
        count = max(1, int(trainer.accumulate_grad_batches))
        if gns is not None and gns.measuring:
            gns.after_backward(min(self._micro, count - 1), count, 1.0 / count)
        self._micro += 1

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """After an optimizer step (a batch that only accumulated is no step)."""
        if self._job.run is None or int(trainer.global_step) == self._seen_step:
            return
        self._seen_step = int(trainer.global_step)
        self._micro = 0
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if self._job.step(loss, {}):  # the record waits for the step's logged values
            trainer.should_stop = True
        self._to_loggers(trainer)

    def _to_loggers(self, trainer: Any) -> None:
        """Rank 0: each change to the Trainer's loggers, at its step: the numbers as
        ``hpinteract/<name>`` metrics (any logger: TensorBoard, W&B, CSV, MLflow), a line
        of text where the logger's experiment takes text (TensorBoard's add_text)."""
        if not trainer.is_global_zero:
            return  # the loggers write on rank 0 only (Lightning's rank_zero_only)
        fresh = self._job.fresh_changes()
        for change in fresh:
            nums, line = numbers(change), text(change)
            for logger in trainer.loggers:
                if nums:
                    logger.log_metrics(nums, step=change.step)
                add_text = getattr(getattr(logger, "experiment", None), "add_text", None)
                if callable(add_text):
                    add_text(TEXT_TAG, line, change.step)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self._job.run is not None:
            self._job.flush(self._logged(trainer))
            self._job.run._watch.enter()  # a validation loop is no hang (hang_timeout)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._job.run is not None:
            self._job.flush(self._logged(trainer))
            # Every rank, whatever else stops the fit: the boundary is a collective, and
            # each rank reaches this hook after the same step.
            self._job.epoch_boundary(int(trainer.current_epoch) + 1)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        run = self._job.run
        if run is None or trainer.sanity_checking:
            return
        run._watch.leave()
        evals = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        if evals:
            run.log_eval(**self._job.metrics(evals, "pl"))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._job.run is not None:
            self._job.flush(self._logged(trainer))
            self._job.finish()

    # ---- checkpoints --------------------------------------------------------------------
    def _save(self, cmd: Command | None, step: int) -> None:
        """Every rank, at the boundary that agreed on it: Lightning's own checkpoint."""
        trainer = self._trainer
        root = trainer.default_root_dir
        path = os.path.join(root, "checkpoints", f"hpinteract-step={step}.ckpt")
        began = time.time()
        error = None
        try:
            trainer.save_checkpoint(path)
        except Exception as e:  # answered as a failed checkpoint; training goes on
            error = f"{type(e).__name__}: {e}"
        self._job.written(cmd, step, path, began, error)

    def state_dict(self) -> dict[str, Any]:
        """hpinteract's state in Lightning's checkpoints (this callback's entry)."""
        return {"hpinteract": self._job.state()} if self._job.run is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resuming (``fit(ckpt_path=...)``): applied when training starts."""
        self._saved = state_dict.get("hpinteract")
