"""The Hugging Face callback in real ``Trainer.train`` runs: a tiny GPT-2 from a config, 2
ranks on gloo under torchrun (hpi.launch), and one process started by hand.

One job (the module's fixture) is driven through the live bullets; a second resumes from
the checkpoint the first wrote on request; a third, a single process with the
``constant_with_warmup`` schedule, is found with ``hpi.attach("latest")``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from helpers import EXAMPLES, started_by_hand, until, wait_for_step
from transformers import get_scheduler

import hpinteract as hpi

SCRIPT = EXAMPLES / "transformers" / "train.py"
STEPS, WARMUP = 400, 20


def schedule(name: str, warmup: int, total: int):
    """The Trainer's own factor of step t for ``name`` (HF's LambdaLR)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    return get_scheduler(name, opt, num_warmup_steps=warmup,
                         num_training_steps=total).lr_lambdas[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("hf")
    out = root / "after_train.json"
    job = hpi.launch(SCRIPT, nproc=2, hparams={"monitor_gns": 2}, args=[
        "--steps", str(STEPS), "--warmup", str(WARMUP), "--clip", "50", "--report", str(out),
        "--output-dir", str(root / "out"), "--report-to", "tensorboard"])
    wait_for_step(job, 40)
    acks = {"lr": job.set(lr=5e-4)}
    # The other surfaces work on a framework job unchanged: a policy scripted here...
    proposed: list[int] = []

    def beta(ctx):
        if proposed:
            return None
        proposed.append(ctx.step)
        return {"momentum": 0.85}

    job.add_policy(beta, name="beta")
    momentum = until(lambda: changes(job, "momentum"), what="the policy's change")
    acks["momentum"] = momentum[0]
    job.remove_policy("beta")
    # ... and the command line.
    cli = subprocess.run([sys.executable, "-m", "hpinteract.cli", "set", "weight_decay=0.02",
                          "--job", job.id], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    acks["weight_decay"] = changes(job, "weight_decay")[0]
    with pytest.raises(hpi.InvalidHParam) as bad_batch:
        job.set(batch_size=64)
    with pytest.raises(hpi.InvalidCommand) as bad_policy:
        job.add_policy("adaptive_batch", max_batch=256)
    acks["checkpoint"] = job.checkpoint()
    wait_for_step(job, 60)  # past an evaluation (every 50 steps)
    acks["clip"] = job.set(max_grad_norm=1e-3)  # every later step is clipped
    wait_for_step(job, acks["clip"].applied_at_step + 40)  # 2 ranks publish every 16
    acks["stop"] = job.stop()
    state = job.wait(120)
    return {"job": job, "acks": acks, "state": state, "out": out, "root": root,
            "refused": (str(bad_batch.value), str(bad_policy.value))}


Change = namedtuple("Change", "change_id applied_at_step values source")


def changes(job: hpi.Job, name: str) -> list[Change]:
    """The applied changes of ``name`` in the events log, oldest first."""
    ev = job.events()
    rows = ev[(ev["kind"] == "change") & (ev["status"] == "applied")]
    return [Change(r["id"], int(r["applied_at_step"]), r["values"], r["source"])
            for _, r in rows.iterrows() if name in r["values"]]


def test_live_values_on_every_rank_and_the_linear_schedule_goes_on_from_a_set_lr(trained):
    job, acks = trained["job"], trained["acks"]
    for name in ("lr", "momentum", "weight_decay", "clip"):
        step = acks[name].applied_at_step
        assert job.applied_steps(acks[name].change_id) == {0: step, 1: step}, name
    assert acks["momentum"].source == "policy:beta" and acks["weight_decay"].source == "cli"
    lr = job.metrics().set_index("step")["lr"]
    f = schedule("linear", WARMUP, STEPS)
    s = acks["lr"].applied_at_step
    assert lr[s - 1] == pytest.approx(1e-3 * f(s - 1))
    assert lr[s] == pytest.approx(5e-4)
    for t in (s + 1, s + 15, acks["stop"].applied_at_step - 1):
        assert lr[t] == pytest.approx(5e-4 * f(t) / f(s)), t
    after = json.loads(trained["out"].read_text())
    assert after["max_grad_norm"] == 1e-3  # TrainingArguments.max_grad_norm, live


def test_changes_reach_the_trainers_tensorboard_at_their_step(trained):
    """report_to=["tensorboard"]: the changes are a run beside the Trainer's own, under
    the same runs/ folder, and the Trainer's own run is whole."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = trained["root"] / "out" / "runs"
    ours = [p for p in runs.iterdir() if p.name.endswith("-hpinteract")]
    assert len(ours) == 1, list(runs.iterdir())
    theirs = runs / ours[0].name[: -len("-hpinteract")]
    acc = EventAccumulator(str(ours[0]), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    acks = trained["acks"]
    lr = {e.step: e.value for e in acc.Scalars("hpinteract/lr")}
    assert lr == {acks["lr"].applied_at_step: pytest.approx(5e-4)}
    momentum = {e.step: e.value for e in acc.Scalars("hpinteract/momentum")}
    assert momentum == {acks["momentum"].applied_at_step: pytest.approx(0.85)}
    texts = {e.step: e.tensor_proto.string_val[0].decode()
             for e in acc.Tensors("hpinteract/changes/text_summary")}
    s = acks["lr"].applied_at_step  # from the lr in force, that the schedule had moved
    assert texts[s] == f"lr {1e-3 * schedule('linear', WARMUP, STEPS)(s)!r} -> 0.0005 (by api)"
    assert texts[acks["momentum"].applied_at_step] == "momentum 0.9 -> 0.85 (by policy:beta)"
    own = EventAccumulator(str(theirs), size_guidance={"scalars": 0})
    own.Reload()
    steps = [e.step for e in own.Scalars("train/loss")]
    assert steps[-1] >= acks["clip"].applied_at_step  # written on after our first change


def test_the_batch_and_batch_policies_are_refused_with_the_reason(trained):
    bad_batch, bad_policy = trained["refused"]
    assert "batch_size cannot change in this job: the Trainer sizes its loader" in bad_batch
    assert "adaptive_batch" in bad_policy and "gradient_accumulation_steps" in bad_policy
    assert trained["job"].hparams["batch_size"] == 16  # 8 per device x 1 x 2 ranks


def test_logged_loss_evals_and_the_noise_scale_of_unclipped_steps(trained):
    job, clip = trained["job"], trained["acks"]["clip"].applied_at_step
    m = job.metrics().set_index("step")
    assert m["loss"].notna().all()  # logging_steps=1: each step's own loss
    assert {"hf_grad_norm", "samples_per_s", "progress"} <= set(m.columns)
    # Two ranks combine their sums every 16 steps (monitors.GNSMonitor.REDUCE_EVERY).
    assert m["gns"][:clip].notna().sum() >= clip // 16 - 1
    # Clipped steps' gradients have lost their norm: not measured, so nothing published.
    assert m["gns"][clip + 1:].isna().all() and len(m) - clip > 32
    evals = job.evals()
    assert "eval_loss" in evals and evals["step"].tolist()[0] == 49  # the 50th step


def test_stop_ends_train_normally_on_every_rank(trained):
    job, stop = trained["job"], trained["acks"]["stop"]
    assert trained["state"] == hpi.JobState.FINISHED and job.error is None
    assert json.loads(trained["out"].read_text())["global_step"] == stop.applied_at_step
    assert "after train" in job.logs(rank=1)


def test_checkpoint_now_is_the_trainers_folder_and_resuming_keeps_values(trained, tmp_path):
    ack = trained["acks"]["checkpoint"]
    path = Path(ack.path)
    assert path.name == f"checkpoint-{ack.applied_at_step}"
    state = json.loads((path / "trainer_state.json").read_text())
    saved = state["stateful_callbacks"]["HPInteractCallback"]["attributes"]["hpinteract"]
    assert [c["values"] for c in saved["changes"]] == [
        {"lr": 5e-4}, {"momentum": 0.85}, {"weight_decay": 0.02}]
    job = hpi.launch(SCRIPT, nproc=2, args=[  # the same TrainingArguments: the same schedule
        "--steps", str(STEPS), "--warmup", str(WARMUP), "--clip", "50",
        "--output-dir", str(tmp_path), "--resume", str(path)])
    wait_for_step(job, ack.applied_at_step + 3)
    job.stop()
    assert job.wait(120) == hpi.JobState.FINISHED, job.logs()
    assert job.metrics()["step"].min() == ack.applied_at_step
    hp = job.hparams
    assert (hp["momentum"], hp["weight_decay"]) == (0.85, 0.02)
    first = ack.applied_at_step
    old = trained["job"].metrics().set_index("step")["lr"]
    assert job.metrics().set_index("step")["lr"][first] == pytest.approx(old[first])
    ev = job.events()
    carried = ev[(ev["kind"] == "change") & (ev["status"] == "carried")]
    assert len(carried) == 3 and (ev["kind"] == "resumed").sum() == 1


def test_one_process_constant_with_warmup_found_with_attach_latest(tmp_path):
    warm = 200
    with started_by_hand([sys.executable, str(SCRIPT), "--steps", "2000", "--schedule",
                          "constant_with_warmup", "--warmup", str(warm), "--output-dir",
                          str(tmp_path)], tmp_path) as job:
        wait_for_step(job, 50)
        ack = job.set(lr=2e-4)  # in the warmup: it goes on rising, from the value set
        wait_for_step(job, warm + 10)
        stop = job.stop()
    s = ack.applied_at_step
    f = schedule("constant_with_warmup", warm, 2000)
    lr = job.metrics().set_index("step")["lr"]
    assert lr[s] == pytest.approx(2e-4)
    for t in (s + 5, warm - 1, warm + 5, stop.applied_at_step - 1):
        assert lr[t] == pytest.approx(2e-4 * f(t) / f(s)), t


def test_under_accelerate_launch(tmp_path):
    """accelerate's own launcher (its multi-process one is torchrun's: on CPU ranks it
    takes --multi_gpu with the script's use_cpu=True)."""
    accelerate = Path(sys.executable).with_name("accelerate")
    with started_by_hand(
            [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2",
             "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
             str(SCRIPT), "--steps", "3000", "--output-dir", str(tmp_path), "--report",
             str(tmp_path / "o.json")], tmp_path) as job:
        wait_for_step(job, 30)
        ack = job.set(max_grad_norm=0.25)
        assert job.applied_steps(ack.change_id) == {0: ack.applied_at_step,
                                                   1: ack.applied_at_step}
        stop = job.stop()
    after = json.loads((tmp_path / "o.json").read_text())
    assert after == {**after, "global_step": stop.applied_at_step, "max_grad_norm": 0.25}
