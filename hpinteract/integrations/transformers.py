"""Hugging Face ``Trainer``: ``Trainer(callbacks=[HPInteractCallback()])`` is the whole
change.

Runs in: every rank's training thread, in the Trainer's callback events (under torchrun,
hpi.launch, ``accelerate launch`` or one process).

What is live (docs/frameworks/transformers.md): lr (every param group, ratios kept, the
Trainer's LambdaLR schedule continued from it: trainer/effect.py), momentum (AdamW's
beta1), weight_decay, ``max_grad_norm`` (``TrainingArguments.max_grad_norm``, read at every
step) and the user's own hyper-parameters, all at the next optimizer step. The global
batch is not: the Trainer sizes its loader and counts its steps from
``per_device_train_batch_size`` and ``gradient_accumulation_steps`` once, when ``train()``
starts, so ``set(batch_size=...)`` is refused with that reason. Stop is
``control.should_training_stop`` on every rank at the same step; checkpoint-now is
``control.should_save``: the Trainer's own ``checkpoint-<step>`` folder, whose
``trainer_state.json`` carries hpinteract's state (this callback is an ExportableState),
so ``train(resume_from_checkpoint=...)`` keeps the values in force and the history. Each
change also goes to the trackers of ``report_to`` (TensorBoard, W&B, MLflow: reporters.py).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..protocol.errors import ConfigError
from ..protocol.hparams import HParam
from ..trainer.commands import Command
from ..trainer.driven import Driven
from .adapter import Found, FrameworkJob, WithRun, fixed
from .reporters import Reporters

WHY_BATCH = ("the Trainer sizes its loader and counts its steps from "
             "per_device_train_batch_size and gradient_accumulation_steps once, when train() "
             "starts: checkpoint the job, then resume it with new TrainingArguments")
WHY_SYNC = "the Trainer's accelerator owns the gradient all-reduce"
WHY_EVERY = ("the Trainer writes periodic checkpoints itself: TrainingArguments("
             "save_steps=N); job.checkpoint() writes one now")


def _inner(scheduler: Any) -> Any:
    """accelerate wraps the scheduler (AcceleratedScheduler): bind the LambdaLR inside."""
    return getattr(scheduler, "scheduler", scheduler)


class HPInteractCallback(WithRun, TrainerCallback, ExportableState):
    """Live hyper-parameters, metrics, pause/stop and checkpoints for ``Trainer.train``.

    ``hparams`` and ``specs`` are the job's own hyper-parameters, as in ``hpi.init``
    (read them with ``callback.hp[name]``); the other keyword arguments are hpi.init's
    settings (``sync_every``, ``policies``, ...)."""

    def __init__(self, hparams: Mapping[str, Any] | None = None,
                 specs: Mapping[str, HParam] | None = None, **settings: Any) -> None:
        self._job = FrameworkJob("transformers", hparams, specs, settings)
        self._args: Any = None
        self._control: Any = None
        self._saving: tuple[Command | None, int, float] | None = None  # asked, not yet on disk
        self._micro = 0
        self._ending = False
        self._made = time.time()  # the trackers' run directories are newer
        self._reporters: Reporters | None = None

    def state(self) -> dict[str, Any]:
        """ExportableState: hpinteract's part of the Trainer's checkpoints."""
        saved = self._job.state() if self._job.run is not None else {}
        return {"args": {}, "attributes": {"hpinteract": saved}}

    # ---- the start ----------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The optimizer and scheduler exist, a resumed checkpoint is loaded."""
        optimizer, model = kwargs.get("optimizer"), kwargs.get("model")
        if optimizer is None or model is None:
            raise ConfigError("the Trainer gave the callback no optimizer or model")
        world = int(args.world_size)
        accum = int(args.gradient_accumulation_steps)
        per_rank = int(state.train_batch_size or args.per_device_train_batch_size)
        specs = {
            "batch_size": fixed(per_rank * accum * world, WHY_BATCH,
                                "global batch: per_device_train_batch_size x "
                                "gradient_accumulation_steps x ranks"),
            "max_grad_norm": HParam(float(args.max_grad_norm or 0.0), low=0.0,
                                    doc="gradient clipping by norm (0: off)"),
            "sync": fixed("ssgd", WHY_SYNC), "checkpoint_every": fixed(0, WHY_EVERY)}
        # A resumed run's trainer_state.json holds this callback's state() (ExportableState).
        mine = (state.stateful_callbacks or {}).get(type(self).__name__)
        saved = ((mine.get("attributes") or {}).get("hpinteract") or None
                 if isinstance(mine, dict) else None)
        self._args = args
        if state.is_world_process_zero:
            self._reporters = Reporters(args.report_to, args.output_dir, self._made)
        driven = Driven("transformers", lambda hp: (per_rank, accum), self._save,
                        progress=lambda: (state.global_step / state.max_steps
                                          if state.max_steps else None),
                        flush=self._job.flush)
        self._job.start(
            Found(model, optimizer, _inner(kwargs.get("lr_scheduler")),
                  int(state.global_step), int(state.epoch or 0), {}, specs),
            driven, self._effect, saved)

    def _effect(self, changed: dict[str, Any]) -> None:
        if "max_grad_norm" in changed:  # the training loop reads it at every step
            self._args.max_grad_norm = float(changed["max_grad_norm"])

    # ---- each step ----------------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self._job.run
        if run is not None:
            self._job.flush()
            self._micro = 0
            run._batch_started()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A micro-batch that only accumulated (the noise-scale monitor's small batch)."""
        self._after_backward(args)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any,
                              **kwargs: Any) -> None:
        """The last micro-batch, after the Trainer clipped the gradients."""
        run = self._job.run
        if run is None or run._gns is None or not run._gns.measuring:
            return
        clip = float(args.max_grad_norm or 0.0)
        if clip > 0:
            # A clipped step's all-reduced gradient has lost its norm: the noise scale
            # would be wrong, so such a step is not measured (docs/frameworks).
            grads = [p.grad for p in run._gns.params if p.grad is not None]
            norm = float(torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
            if norm >= clip * (1 - 1e-4):
                run._gns.skip_step()
                return
        self._after_backward(args)

    def _after_backward(self, args: Any) -> None:
        run = self._job.run
        if run is None:
            return
        count = max(1, int(args.gradient_accumulation_steps))
        if run._gns is not None and run._gns.measuring:
            run._gns.after_backward(min(self._micro, count - 1), count, 1.0 / count)
        self._micro += 1

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Before the scheduler's step: the lr this step used, for its record."""
        run = self._job.run
        if run is not None and run.driven is not None:
            run.driven.lr_used = float(run.optimizer.param_groups[0]["lr"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After the optimizer and scheduler stepped: the step boundary."""
        run = self._job.run
        if run is None:
            return
        self._control = control
        # The record is held (FrameworkJob.flush): the Trainer logs the loss of this step
        # just after this event, in on_log.
        if self._job.step(None, {}):
            control.should_training_stop = True
        if self._reporters is not None and self._reporters.active:
            self._reporters.tell(self._job.fresh_changes())

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        run = self._job.run
        if run is None or not logs:
            return
        if any(k.startswith("eval_") for k in logs):
            return  # on_evaluate has them
        values = dict(logs)
        loss = values.pop("loss", None)
        metrics = self._job.metrics({k: v for k, v in values.items()
                                     if k not in ("epoch", "learning_rate", "total_flos")},
                                    "hf")
        if loss is not None and not (isinstance(loss, float) and math.isnan(loss)):
            metrics["loss"] = loss
        self._job.flush(metrics)

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An evaluation batch: the evaluation is moving, so it is no hang (hang_timeout)."""
        run = self._job.run
        if run is not None and run._watch.beat is not None:
            run._watch.beat = time.perf_counter()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None,
                    **kwargs: Any) -> None:
        run = self._job.run
        if run is not None and metrics:
            evals = {k: v for k, v in metrics.items() if k != "epoch"}
            run.log_eval(**self._job.metrics(evals, "hf"))

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._job.run is not None:
            self._job.run.epoch = int(state.epoch or 0)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._job.run is None:
            return
        self._ending = True
        if self._reporters is not None:
            self._reporters.close()
        self._job.finish()

    # ---- checkpoints --------------------------------------------------------------------
    def _save(self, cmd: Command | None, step: int) -> None:
        """Every rank, at the boundary that agreed on it: the Trainer saves at this step."""
        if self._ending or self._control is None:
            self._job.written(cmd, step, "", time.time(),
                              "the training ended before the Trainer could save")
            return
        self._control.should_save = True
        self._saving = (cmd, step, time.time())

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._saving is None:
            return
        cmd, step, began = self._saving
        self._saving = None
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        error = None if os.path.isdir(path) else f"the Trainer wrote no {path}"
        self._job.written(cmd, step, path, began, error)
