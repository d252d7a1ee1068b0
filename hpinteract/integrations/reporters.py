"""The Hugging Face Trainer's trackers (``TrainingArguments(report_to=...)``), told of each
change, so that a TensorBoard, W&B or MLflow user sees it where they already look.

Runs in: rank 0's training thread, in the Trainer's callback events (the trackers write
on rank 0 only, as the Trainer's own integrations do).

A Trainer callback gets no handle on the others: the writer HF's ``TensorBoardCallback``
holds is out of reach, and the reporting callbacks run before the user's, so a change
cannot ride in the Trainer's own logs. Each tracker is reached through its own public,
process-wide handle instead:

- ``tensorboard``: a run of our own beside the Trainer's, ``<its log dir>-hpinteract``
  (TensorBoard follows one writer per run directory: writing into the Trainer's would
  hide what it writes after us). ``tensorboard --logdir <output_dir>/runs`` shows both.
- ``wandb``: the active run (``wandb.run``), at the Trainer's step metric
  ``train/global_step``.
- ``mlflow``: the active run (``mlflow.active_run()``).

Every number as ``hpinteract/<name>`` at the step it took effect, and a line of text
("lr 0.001 -> 0.0005 (by cli): reason") where the tracker takes text; the Lightning
callback hands its loggers the same (``numbers``, ``text``). Other trackers
(comet, trackio, ...) are not told: ``job.export("tensorboard", dir)`` serves them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ..protocol.changes import Applied

SUFFIX = "-hpinteract"
TEXT_TAG = "hpinteract/changes"


def numbers(change: Applied) -> dict[str, float]:
    """The change's numeric values as tracker metrics."""
    return {f"hpinteract/{n}": float(v) for n, v in change.values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def text(change: Applied) -> str:
    """One line: what changed from what to what, by whom, why."""
    parts = [f"{n} {change.previous[n]!r} -> {v!r}" if n in change.previous else
             f"{n} = {v!r}" for n, v in change.values.items()]
    why = f": {change.reason}" if change.reason else ""
    return f"{', '.join(parts)} (by {change.source}){why}"


def trainer_logdir(output_dir: str, since: float) -> Path | None:
    """The directory HF's TensorBoardCallback writes to: ``TENSORBOARD_LOGGING_DIR``, else
    the newest ``<output_dir>/runs/<time>_<host>`` made since ``since`` (its writer is
    made in on_train_begin, before this callback's)."""
    env = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if env:
        return Path(env).expanduser()
    runs = Path(output_dir) / "runs"
    try:
        made = [p for p in runs.iterdir() if p.is_dir() and not p.name.endswith(SUFFIX)
                and p.stat().st_mtime >= since - 1.0]
    except FileNotFoundError:
        return None
    return max(made, key=lambda p: p.stat().st_mtime, default=None)


class Reporters:
    """The trackers of one ``train()``: ``tell`` each change as it is applied."""

    def __init__(self, report_to: list[str] | str | None, output_dir: str,
                 started: float) -> None:
        wanted = [report_to] if isinstance(report_to, str) else list(report_to or [])
        self._tb: Any = None
        if "tensorboard" in wanted:
            found = trainer_logdir(output_dir, started)
            if found is not None:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(found) + SUFFIX)
        # Imported already where the Trainer reports to them: sys.modules, never an import
        # of a tracker the user did not ask for.
        self._wandb = sys.modules.get("wandb") if "wandb" in wanted else None
        self._mlflow = sys.modules.get("mlflow") if "mlflow" in wanted else None

    @property
    def active(self) -> bool:
        return self._tb is not None or self._wandb is not None or self._mlflow is not None

    @property
    def tensorboard_dir(self) -> str | None:
        return None if self._tb is None else str(self._tb.log_dir)

    def tell(self, changes: list[Applied]) -> None:
        for change in changes:
            nums = numbers(change)
            if self._tb is not None:
                for tag, value in nums.items():
                    self._tb.add_scalar(tag, value, change.step)
                self._tb.add_text(TEXT_TAG, text(change), change.step)
                self._tb.flush()  # a change is rare: seen at once
            run = getattr(self._wandb, "run", None)
            if run is not None:
                run.log({**nums, TEXT_TAG: text(change), "train/global_step": change.step})
            if self._mlflow is not None and self._mlflow.active_run() is not None:
                if nums:
                    self._mlflow.log_metrics(nums, step=change.step)
                self._mlflow.set_tag("hpinteract/last_change", text(change))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
