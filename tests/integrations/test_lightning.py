"""The Lightning callback in real fits: 2 ranks on gloo under torchrun (hpi.launch), and
Lightning's own launcher (devices=2, no torchrun) with the ``pytorch_lightning`` import.

One job (the module's fixture) is driven through every live bullet, checked from the
client and from what the script itself reports after ``fit()``; a second job resumes from
the checkpoint the first wrote on request.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import EXAMPLES, started_by_hand, wait_for_step

import hpinteract as hpi

SCRIPT = EXAMPLES / "lightning" / "train.py"
WARMUP = 400  # steps of the per-step LambdaLR warmup: lr is still rising when it is set
PER_EPOCH = 47  # 1,500 samples / 2 ranks / 16 per rank and forward


def factor(step: int) -> float:
    return min(1.0, (step + 1) / WARMUP)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 2-rank fit, changed while it trains, checkpointed on request, then stopped."""
    root = tmp_path_factory.mktemp("lightning")
    out = root / "after_fit.json"
    # The per-rank times every 10 steps (100 by default), so that several reach the log.
    job = hpi.launch(SCRIPT, nproc=2, hparams={"monitor_gns": 2, "monitor_ranks": 10}, args=[
        "--epochs", "6", "--report", str(out), "--root", str(root), "--warmup", str(WARMUP),
        "--csv-log", str(root / "csv")])
    wait_for_step(job, 20)
    acks = {
        "lr": job.set(lr=0.004, reason="warmup too fast"),
        "momentum": job.set(momentum=0.8),
        "weight_decay": job.set(weight_decay=0.05),
        "clip": job.set(gradient_clip_val=0.5),
        "dropout": job.set(dropout=0.1),
    }
    with pytest.raises(hpi.InvalidHParam) as bad_batch:
        job.set(batch_size=100)
    with pytest.raises(hpi.InvalidHParam) as bad_sync:
        job.set(sync="model_averaging")
    with pytest.raises(hpi.InvalidCommand) as bad_policy:
        job.add_policy("scale_workers", max_workers=4)
    acks["batch"] = job.set(batch_size=64)
    acks["checkpoint"] = job.checkpoint()
    acks["pause"] = job.pause()
    paused_at = job.status()["step"]  # the next step to run
    time.sleep(0.5)
    still = job.status()["step"]
    resumed_at = time.time()
    job.resume()
    # Into the epoch after the one the new batch size ran a whole of, and past step 120
    # whenever the change landed (the noise scale needs steps to measure: see below).
    wait_for_step(job, max(acks["batch"].applied_at_step + PER_EPOCH // 2 + 2, 120))
    acks["stop"] = job.stop()
    state = job.wait(120)
    return {"job": job, "acks": acks, "state": state, "out": out,
            "paused": (paused_at, still, resumed_at),
            "refused": (str(bad_batch.value), str(bad_sync.value), str(bad_policy.value)),
            "csv": root / "csv" / "fit" / "version_0" / "metrics.csv"}


def test_changes_apply_on_every_rank_at_the_acknowledged_step(fitted):
    job, acks = fitted["job"], fitted["acks"]
    for name in ("lr", "momentum", "weight_decay", "clip", "dropout"):
        step = acks[name].applied_at_step
        assert job.applied_steps(acks[name].change_id) == {0: step, 1: step}, name
    after = json.loads(fitted["out"].read_text())  # what the script reads after fit()
    assert [b[0] for b in after["betas"]] == [0.8, 0.8]
    assert after["wd"] == [0.05, 0.05]
    assert after["clip"] == 0.5  # Trainer.gradient_clip_val
    assert after["dropout"] == 0.1  # the user's own, read by the module as callback.hp


def test_changes_reach_the_trainers_own_logger_at_their_step(fitted):
    """A CSVLogger here; TensorBoard, W&B or MLflow get the same log_metrics call."""
    import csv

    with open(fitted["csv"]) as f:
        rows = list(csv.DictReader(f))
    logged = {(int(r["step"]), name[len("hpinteract/"):], float(value))
              for r in rows for name, value in r.items()
              if name.startswith("hpinteract/") and value}
    acks = fitted["acks"]
    assert (acks["lr"].applied_at_step, "lr", 0.004) in logged
    assert (acks["momentum"].applied_at_step, "momentum", 0.8) in logged
    assert (acks["dropout"].applied_at_step, "dropout", 0.1) in logged


def test_a_set_lr_is_the_next_steps_and_the_warmup_goes_on_from_it(fitted):
    job, ack = fitted["job"], fitted["acks"]["lr"]
    lr = job.metrics().set_index("step")["lr"]
    s = ack.applied_at_step
    assert lr[s - 1] == pytest.approx(0.01 * factor(s - 1))  # the schedule before
    assert lr[s] == pytest.approx(0.004)  # the value set, not overwritten by the scheduler
    for t in (s + 1, s + 10, s + 40):  # the warmup's shape, from the value set
        assert lr[t] == pytest.approx(0.004 * factor(t) / factor(s)), t
    after = json.loads(fitted["out"].read_text())
    assert after["lrs"][1] / after["lrs"][0] == pytest.approx(2.0)  # the groups' ratio kept


def test_batch_size_changes_at_the_next_epoch_and_refusals_say_why(fitted):
    job, ack = fitted["job"], fitted["acks"]["batch"]
    bad_batch, bad_sync, bad_policy = fitted["refused"]
    assert "multiple of 32" in bad_batch and "accumulate_grad_batches" in bad_batch
    assert "sync cannot change in this job: Lightning's strategy" in bad_sync
    assert "scale_workers" in bad_policy and "keeps the number of ranks" in bad_policy
    assert ack.applied_at_step % PER_EPOCH == 0  # the first step of an epoch
    m = job.metrics().set_index("step")
    assert m["batch_size"][ack.applied_at_step - 1] == 32
    assert m["batch_size"][ack.applied_at_step] == 64
    assert json.loads(fitted["out"].read_text())["accumulate"] == 2
    # Twice the samples per step: the epoch after the change has half the steps.
    epoch = m["epoch"][ack.applied_at_step]
    # 47 batches in pairs, and Lightning steps on the last one alone: 24 steps.
    assert (m["epoch"] == epoch).sum() == PER_EPOCH // 2 + 1


def test_metrics_evals_and_the_noise_scale_stream(fitted):
    m = fitted["job"].metrics()
    assert {"loss", "train_loss", "pl_lr", "samples_per_s", "step_time", "gns",
            "step_time_r1", "straggler"} <= set(m)  # the per-rank monitor (every 10 steps)
    assert m["straggler"].notna().sum() >= 3
    assert m["loss"].notna().all()
    assert m["gns"].notna().sum() > 5
    evals = fitted["job"].evals()
    assert {"val_loss", "val_acc"} <= set(evals)
    assert len(evals) >= 2


def test_pause_holds_and_stop_ends_fit_normally_on_every_rank(fitted):
    job, acks = fitted["job"], fitted["acks"]
    held, still, resumed_at = fitted["paused"]
    step = acks["pause"].applied_at_step
    assert held == still == step
    m = fitted["job"].metrics()
    assert m[m["step"] >= step]["time"].min() > resumed_at  # nothing ran while paused
    assert fitted["state"] == hpi.JobState.FINISHED and job.error is None
    after = json.loads(fitted["out"].read_text())  # the script's code after fit() ran
    assert after["global_step"] == acks["stop"].applied_at_step
    assert "after fit 1" in job.logs(rank=1)


def test_checkpoint_now_is_lightnings_own_and_resuming_keeps_values_and_history(
        fitted, tmp_path):
    ack = fitted["acks"]["checkpoint"]
    path = Path(ack.path)
    assert path.name == f"hpinteract-step={ack.applied_at_step}.ckpt" and path.is_file()
    ckpt = torch.load(path, weights_only=False)
    assert ckpt["global_step"] == ack.applied_at_step
    saved = next(v["hpinteract"] for k, v in ckpt["callbacks"].items()
                 if "HPInteractCallback" in k)
    assert [c["values"] for c in saved["changes"]][:2] == [{"lr": 0.004}, {"momentum": 0.8}]
    out = tmp_path / "resumed.json"
    job = hpi.launch(SCRIPT, nproc=2, args=[
        "--epochs", "4", "--report", str(out), "--root", str(tmp_path), "--warmup", str(WARMUP),
        "--ckpt", str(path)])
    assert job.wait(180) == hpi.JobState.FINISHED, job.logs()
    hp = job.hparams
    assert (hp["dropout"], hp["gradient_clip_val"], hp["batch_size"]) == (0.1, 0.5, 64)
    first = job.metrics()["step"].min()
    assert first == ack.applied_at_step  # steps counted on from the checkpoint
    # The lr in force at the checkpoint (the schedule continued from the value set).
    old = fitted["job"].metrics().set_index("step")["lr"]
    assert job.metrics().set_index("step")["lr"][first] == pytest.approx(old[first])
    ev = job.events()
    assert (ev["kind"] == "resumed").sum() == 1
    carried = ev[(ev["kind"] == "change") & (ev["status"] == "carried")]
    assert list(carried["applied_at_step"])[:2] == [fitted["acks"]["lr"].applied_at_step,
                                                   fitted["acks"]["momentum"].applied_at_step]
    assert json.loads(out.read_text())["accumulate"] == 2


def test_pytorch_lightning_import_under_lightnings_own_launcher(tmp_path):
    """No torchrun: Lightning starts the second process itself; a client finds the job
    as one started by hand (``hpi.attach("latest")``)."""
    out = tmp_path / "out.json"
    with started_by_hand([sys.executable, str(SCRIPT), "--package", "pytorch_lightning",
                          "--devices", "2", "--epochs", "50", "--report", str(out),
                          "--root", str(tmp_path)], tmp_path) as job:
        wait_for_step(job, 5)
        ack = job.set(lr=0.002)
        assert job.applied_steps(ack.change_id) == {0: ack.applied_at_step,
                                                   1: ack.applied_at_step}
        stop = job.stop()
    assert json.loads(out.read_text())["global_step"] == stop.applied_at_step
    assert job.wait(30) == hpi.JobState.FINISHED
