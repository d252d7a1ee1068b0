"""The Trainer's trackers, below the real runs of test_transformers.py (which writes the
TensorBoard run for real): finding the Trainer's log directory, and what W&B and MLflow
are handed. W&B and MLflow are not installed here: stand-ins in ``sys.modules`` record the
calls of their public API (``wandb.run.log``, ``mlflow.log_metrics``)."""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path

import pytest

from hpinteract.integrations.reporters import Reporters, text, trainer_logdir
from hpinteract.protocol.changes import Applied

CHANGE = Applied(120, "policy:plateau", {"lr": 0.01, "freeze": True}, {"lr": 0.1},
                 "loss flat for 3 evals")


def test_the_text_says_what_from_what_by_whom_why() -> None:
    assert text(CHANGE) == "lr 0.1 -> 0.01, freeze = True (by policy:plateau): " \
                           "loss flat for 3 evals"


def test_the_trainers_log_dir_is_the_newest_made_since_the_start(tmp_path: Path,
                                                               monkeypatch) -> None:
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    assert trainer_logdir(str(tmp_path), time.time()) is None  # no runs/ yet
    runs = tmp_path / "runs"
    old, new = runs / "Dec06_10-00-00_host", runs / "Dec07_10-00-00_host"
    for d in (old, new, runs / "Dec07_10-00-00_host-hpinteract"):
        d.mkdir(parents=True)
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # an earlier train()
    assert trainer_logdir(str(tmp_path), time.time() - 5) == new
    assert trainer_logdir(str(tmp_path), time.time() + 60) is None  # none since
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "mine"))
    assert trainer_logdir(str(tmp_path), time.time()) == tmp_path / "mine"


def test_wandb_and_mlflow_get_the_numbers_at_the_step_and_the_text(monkeypatch) -> None:
    calls: list[tuple] = []
    run = types.SimpleNamespace(log=lambda data: calls.append(("wandb", data)))
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(run=run))
    mlflow = types.SimpleNamespace(
        active_run=lambda: object(),
        log_metrics=lambda m, step: calls.append(("mlflow", m, step)),
        set_tag=lambda k, v: calls.append(("mlflow-tag", k, v)))
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    reporters = Reporters(["wandb", "mlflow"], "/nonexistent", time.time())
    assert reporters.active and reporters.tensorboard_dir is None
    reporters.tell([CHANGE])
    line = text(CHANGE)
    assert calls == [  # a bool is no metric: only in the text
        ("wandb", {"hpinteract/lr": 0.01, "hpinteract/changes": line,
                   "train/global_step": 120}),
        ("mlflow", {"hpinteract/lr": 0.01}, 120),
        ("mlflow-tag", "hpinteract/last_change", line)]


@pytest.mark.parametrize("report_to", [[], "none", ["comet_ml"]])
def test_trackers_not_asked_for_are_never_touched(report_to, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb",
                        types.SimpleNamespace(run=None))
    assert not Reporters(report_to, "/nonexistent", time.time()).active
