"""End to end against one real 2-rank torchrun job on gloo: changes, validation, pause,
attach from another process, security. The last test stops the job and checks, from what
every rank recorded, that each acknowledged change took effect at the acknowledged step."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
import time
from collections import Counter

import pandas as pd
import pytest
import zmq
from helpers import TOY, trace, until, wait_for_step

import hpinteract as hpi
import hpinteract.client.channel as channel_module
from hpinteract.protocol.codec import Codec
from hpinteract.protocol.connection import ConnectionInfo
from hpinteract.protocol.messages import make_message

N, BATCH = 2048, 16  # 128 steps per epoch at the start


def observed(row: dict, name: str):
    """What a rank's trace shows for a hyper-parameter at one step."""
    return {"lr": row["lr"], "batch_size": row["local_batch"] * 2, "dropout": row["dropout"],
            "note": row["note_len"]}[name]


@pytest.fixture(scope="module")
def job():
    j = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.004}, args=["--n", str(N)])
    wait_for_step(j, 5)
    yield j
    if not j.state.terminal:
        j.stop()
    j.wait(60)


def test_set_is_acknowledged_with_a_step_and_reflected_in_hparams(job):
    ack = job.set(lr=0.02, dropout=0.3)
    assert ack.values == {"lr": 0.02, "dropout": 0.3}
    assert ack.applied_at_step > 0
    assert job.hparams["lr"] == 0.02 and job.hparams["dropout"] == 0.3
    assert job.applied_steps(ack.change_id) == {0: ack.applied_at_step, 1: ack.applied_at_step}


def change_batch_mid_epoch(job: hpi.Job, to: int) -> hpi.Ack:
    """``batch_size=to`` applied in the first half of an epoch (not at its start), and that
    epoch left to finish."""
    before = job.hparams["batch_size"]
    steps_per_epoch = N // before
    while True:  # aim at the first half of an epoch so the change lands mid-epoch
        step = wait_for_step(job, 0)
        if steps_per_epoch * 0.15 < step % steps_per_epoch < steps_per_epoch * 0.5:
            break
        time.sleep(0.01)
    ack = job.set(batch_size=to)
    while ack.applied_at_step % steps_per_epoch == 0:  # landed on an epoch boundary: again
        job.set(batch_size=before)
        wait_for_step(job, wait_for_step(job, 0) + 3 * steps_per_epoch // 2)
        ack = job.set(batch_size=to)
    wait_for_step(job, ack.applied_at_step + N // min(before, to))  # that epoch finishes
    return ack


def test_batch_size_change_mid_epoch_keeps_the_epoch(job):
    ack = change_batch_mid_epoch(job, 32 if job.hparams["batch_size"] != 32 else BATCH)
    assert job.hparams["batch_size"] == ack.values["batch_size"]
    assert job.applied_steps(ack.change_id) == {0: ack.applied_at_step, 1: ack.applied_at_step}
    # (that every sample of its epoch was used once is checked on the traces, at the end)


@pytest.mark.parametrize(
    ("values", "error", "field", "words"),
    [
        ({"lrr": 0.1}, hpi.InvalidHParam, "lrr", "did you mean 'lr'"),
        ({"lr": "fast"}, hpi.InvalidHParam, "lr", "must be float"),
        ({"lr": math.nan}, hpi.InvalidHParam, "lr", "not a finite number"),
        ({"lr": math.inf}, hpi.InvalidHParam, "lr", "not a finite number"),
        ({"lr": -0.5}, hpi.InvalidHParam, "lr", "below the minimum"),
        ({"dropout": 0.95}, hpi.InvalidHParam, "dropout", "above the maximum"),
        ({"mode": "c"}, hpi.InvalidHParam, "mode", "not one of the allowed values"),
        ({"batch_size": 33}, hpi.InvalidHParam, "batch_size", "cannot be shared by 2 ranks"),
        ({"batch_size": 0}, hpi.InvalidHParam, "batch_size", "below the minimum"),
        ({"lr": 0.9, "momentum": 2.0}, hpi.InvalidHParam, "momentum", "above the maximum"),
        ({}, hpi.InvalidHParam, None, "no hyper-parameter values"),
    ],
)
def test_invalid_input_is_rejected_by_name_and_nothing_applies(job, values, error, field, words):
    before = job.hparams
    with pytest.raises(error) as exc:
        job.set(values)
    assert exc.value.field == field
    assert words in str(exc.value)
    assert job.hparams == before  # in particular lr=0.9 of the last case did not apply
    last = job.events().query("kind == 'change'").iloc[-1]
    assert last["status"] == "rejected"
    assert last["field"] == field if field else pd.isna(last["field"])


def test_a_command_the_state_does_not_allow_is_rejected(job):
    with pytest.raises(hpi.InvalidState, match="cannot resume a job that is running"):
        job.resume()


def test_pause_holds_every_rank_and_resume_continues(job):
    ack = job.pause()
    assert job.state == hpi.JobState.PAUSED
    held = wait_for_step(job, ack.applied_at_step - 1)
    assert held == ack.applied_at_step - 1  # the last step before the boundary, no further
    time.sleep(0.5)
    assert job.status()["latest"]["step"] == held
    change = job.set(lr=0.03)  # applies at the paused boundary
    assert change.applied_at_step == ack.applied_at_step
    job.resume()
    wait_for_step(job, held + 5)
    assert job.state == hpi.JobState.RUNNING


def test_second_process_attaches_mid_run_and_gets_the_complete_history(job):
    code = (
        "import json, sys, hpinteract as hpi\n"
        f"job = hpi.attach({job.id!r})\n"
        "steps, kinds = [], []\n"
        "for rec in job.stream():\n"
        "    if 'step' in rec and 'kind' not in rec: steps.append(rec['step'])\n"
        "    else: kinds.append(rec['kind'])\n"
        "    if len(steps) > 10 and steps[-1] >= int(sys.argv[1]): break\n"
        "print(json.dumps({'steps': steps, 'kinds': kinds}))\n"
    )
    target = wait_for_step(job, 0) + 40  # history first, then at least 40 live steps
    out = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True,
                         text=True, timeout=120, check=True)
    got = json.loads(out.stdout)
    assert got["steps"] == list(range(len(got["steps"])))  # from step 0, no gap, no repeat
    assert got["steps"][-1] >= target
    assert "change" in got["kinds"] and "state" in got["kinds"]


def test_metrics_history_is_one_row_per_step(job):
    df = job.metrics()
    assert list(df["step"]) == list(range(len(df)))
    for col in ("loss", "acc", "lr", "batch_size", "samples_per_s", "step_time", "epoch"):
        assert col in df.columns
    assert df["loss"].notna().all()


def test_events_record_source_status_and_step(job):
    ack = job.set(lr=0.04, source="notebook-test")
    ev = job.events()
    row = ev[ev["id"] == ack.change_id].iloc[0]
    assert row["source"] == "notebook-test"
    assert row["status"] == "applied"
    assert row["applied_at_step"] == ack.applied_at_step


def test_a_change_records_the_values_it_replaced(job):
    before = job.hparams["dropout"]
    ack = job.set(dropout=0.125, reason="less regularisation")
    ev = job.events()
    row = ev[ev["id"] == ack.change_id].iloc[0]
    assert row["previous"] == {"dropout": before} and row["reason"] == "less regularisation"


def test_export_to_tensorboard_every_metric_and_each_change_at_its_step(job, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    before = job.hparams["lr"]
    ack = job.set(lr=0.0125, source="export-test", reason="try lower")
    # The export reads the run directory: wait for the step to be written there (the
    # status announces a step before the coordinator's next write of the log).
    until(lambda: job.metrics().step.max() > ack.applied_at_step, what="the step on disk")
    out = job.export("tensorboard", tmp_path)
    assert out == tmp_path / job.id
    acc = EventAccumulator(str(out), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert {"loss", "acc", "lr", "batch_size", "samples_per_s"} <= set(acc.Tags()["scalars"])
    assert not {"epoch", "time"} & set(acc.Tags()["scalars"])  # bookkeeping stays out
    lr = {e.step: e.value for e in acc.Scalars("lr")}
    assert len(lr) == len(acc.Scalars("lr"))  # one point a step
    assert lr[ack.applied_at_step] == pytest.approx(0.0125)
    assert lr[ack.applied_at_step - 1] == pytest.approx(before)
    texts = {e.step: e.tensor_proto.string_val[0].decode()
             for e in acc.Tensors("hpinteract/changes")}
    assert texts[ack.applied_at_step] == f"**lr** {before!r} → 0.0125 (by export-test): try lower"
    job.export("tensorboard", tmp_path)  # again: replaces its own file
    assert len(list(out.glob("events.out.tfevents.*"))) == 1
    with pytest.raises(hpi.ConfigError, match="export format 'csv': one of tensorboard"):
        job.export("csv", tmp_path)


def test_connection_file_is_owner_only_and_sockets_listen_on_loopback_only(job):
    conn = job.run_dir.connection
    assert stat.S_IMODE(os.stat(conn).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(job.run_dir.path).st_mode) == 0o700
    info = ConnectionInfo.read(conn)
    listening = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, st = line.split()[1], line.split()[3]
                if st == "0A":  # LISTEN
                    addr, port = local.rsplit(":", 1)
                    listening.setdefault(int(port, 16), set()).add(addr)
    for port in (info.control_port, info.pub_port):
        assert listening.get(port) == {"0100007F"}, (port, listening.get(port))


def _raw_request(info: ConnectionInfo, frames: list[bytes]) -> list[bytes]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(info.control_url)
    try:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "no reply"
        return sock.recv_multipart()
    finally:
        sock.close()


def test_forged_and_replayed_messages_are_rejected_and_never_applied(job):
    info = ConnectionInfo.read(job.run_dir.connection)
    good = Codec(info.key_bytes)
    forged = Codec(b"not-the-key-" * 4)
    before = job.hparams["lr"]

    msg = make_message("set", {"values": {"lr": 0.5}}, session="attacker", req_id="r1")
    reply = good.unpack(_raw_request(info, forged.pack(msg)))[1].content
    assert reply["ok"] is False and reply["error"]["type"] == "AuthError"

    unsigned = [b"{}", b'{"values": {"lr": 0.5}}']
    reply = good.unpack(_raw_request(info, unsigned))[1].content
    assert reply["error"]["type"] == "AuthError"

    legit = make_message("set", {"values": {"lr": 0.06}, "source": "replay-test"},
                         session="s", req_id="r2")
    frames = good.pack(legit)
    reply = Codec(info.key_bytes).unpack(_raw_request(info, frames))[1].content
    assert reply["ok"] is True
    job.set(lr=before)  # so the replay below would be visible if it applied
    reply = Codec(info.key_bytes).unpack(_raw_request(info, frames))[1].content
    assert reply["ok"] is False and "replayed" in reply["error"]["message"]
    assert job.hparams["lr"] == before
    sec = job.events().query("kind == 'security'")
    assert len(sec) >= 3


def test_one_job_shared_by_threads_neither_hangs_nor_mixes_replies(job):
    from concurrent.futures import ThreadPoolExecutor

    def query(_):
        return [job.status()["job_id"] for _ in range(20)]

    with ThreadPoolExecutor(4) as pool:
        queries = [pool.submit(query, i) for i in range(3)]
        change = pool.submit(job.set, dropout=0.35)
        assert all(q.result(timeout=60) == [job.id] * 20 for q in queries)
        change.result(timeout=60)
    assert job.hparams["dropout"] == 0.35


def test_a_change_longer_than_the_control_word_reaches_every_rank(job):
    job.set(note="x" * 3000)  # > 1 KiB: the second broadcast round
    assert len(job.hparams["note"]) == 3000


def test_a_command_that_times_out_is_withdrawn_and_never_applies(job, monkeypatch):
    job.set(sleep=3.0)  # slow steps: the next boundary is seconds away
    monkeypatch.setattr(channel_module, "COMMAND_TIMEOUT_S", 0.5)
    monkeypatch.setattr(channel_module, "COMMAND_RETRIES", 0)
    with pytest.raises(hpi.HpiTimeout, match="withdrawn and not applied"):
        job.set(lr=0.077)
    monkeypatch.undo()
    job.set(sleep=0.004)  # waits for the slow step's boundary
    assert job.hparams["lr"] != 0.077
    ev = job.events().query("kind == 'change'")
    assert "cancelled" in set(ev["status"])
    assert not any(v == {"lr": 0.077} for v in ev.query("status == 'applied'")["values"])


def test_stop_ends_every_rank_at_one_step_and_every_change_applied_where_acked(job):
    """Read from the job's own events (whichever tests ran before): every change applied
    is in force on both ranks from its step, not one step early; within the epoch of
    every batch-size change each sample was used exactly once."""
    change_batch_mid_epoch(job, 32 if job.hparams["batch_size"] != 32 else BATCH)
    job.set(lr=0.011)
    pause = job.pause()
    stop = job.stop()  # while paused
    assert stop.applied_at_step == pause.applied_at_step
    assert job.wait(60) == hpi.JobState.FINISHED
    t0, t1 = trace(job, 0), trace(job, 1)
    assert [r["step"] for r in t0] == [r["step"] for r in t1] == list(range(len(t0)))
    assert len(t0) == stop.applied_at_step  # the loop ended before that step, on both ranks
    ev = job.events()
    applied = ev[(ev.kind == "change") & (ev.status == "applied")].to_dict("records")
    traced = [(int(c["applied_at_step"]),
               {n: (len(v) if n == "note" else v) for n, v in c["values"].items()
                if n in ("lr", "batch_size", "dropout", "note")}) for c in applied]
    traced = [(s, values) for s, values in traced if values]
    assert len(traced) >= 2  # this test's own two at least
    last: dict[str, object] = {}  # each name's value in force before the change
    for s, values in traced:
        for name, v in values.items():
            for t in (t0, t1):
                assert observed(t[s], name) == pytest.approx(v), (name, s)
                if s > 0 and last.get(name) != v:  # and not one step early
                    assert observed(t[s - 1], name) != pytest.approx(v), (name, s)
            last[name] = v
    for s, values in traced:
        if "batch_size" in values:
            epoch = t0[s]["epoch"]
            seen = Counter(i for t in (t0, t1) for r in t if r["epoch"] == epoch
                           for i in r["idx"])
            # the change really was mid-epoch: two batch sizes in it
            assert len({r["local_batch"] for r in t0 if r["epoch"] == epoch}) == 2
            assert set(seen.values()) == {1}
            assert len(seen) == N
