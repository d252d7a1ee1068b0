"""A job on two "nodes": two torchrun agents on this machine's loopback, each launched with
its own HPINTERACT_HOME (as two machines without a shared file system), meeting through
the c10d rendezvous. A client on either node reaches rank 0's coordinator, wherever the
rendezvous put it, and a change applies on all four ranks at the same step."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import TOY, job_pids, until, wait_for_step
from lab import free_port

import hpinteract as hpi
from hpinteract.client.history import read_records
from hpinteract.client.nodes import node_records
from hpinteract.protocol.errors import ConfigError
from hpinteract.protocol.rundir import read_json

N = 512  # 32 steps an epoch


def test_two_nodes_apply_a_change_on_every_rank_at_one_step(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    jobs = [hpi.launch(TOY, nproc=2, nnodes=2, rdzv_endpoint=endpoint, job_id="two-nodes",
                       home=tmp_path / f"node{k}", hparams={"sleep": 0.01},
                       args=["--n", str(N), "--epochs", "6"]) for k in (0, 1)]
    try:
        for job in jobs:  # each node's run directory leads to the one coordinator
            wait_for_step(job, 3, timeout=120)
            assert job.status()["world_size"] == 4
        holder = [j for j in jobs if j.run_dir.metrics_log.exists()]
        assert len(holder) == 1  # the logs are on rank 0's node only
        other = jobs[1 - jobs.index(holder[0])]
        ack = other.set(lr=0.02)  # through the node that does not hold rank 0
        assert holder[0].hparams["lr"] == 0.02
    finally:
        for job in jobs:
            job.wait(120)
    assert [j.state.value for j in jobs] == ["finished", "finished"], jobs[0].logs()[-3000:]
    traces = {}
    for job in jobs:
        for path in job.run_dir.path.glob("trace_*.json"):
            traces[int(path.stem.split("_")[1])] = path
    assert sorted(traces) == [0, 1, 2, 3]  # each node kept its own ranks' traces
    for rank, path in traces.items():
        lrs = {t["step"]: t["lr"] for t in json.loads(path.read_text())}
        s = ack.applied_at_step
        assert lrs[s - 1] == 0.05 and lrs[s] == 0.02, rank
        assert {lr for step, lr in lrs.items() if step >= s} == {0.02}
    assert not any(j.run_dir.connection.exists() for j in jobs)  # nobody answers there now


def test_several_nodes_need_a_meeting_point_and_one_id(tmp_path):
    with pytest.raises(ConfigError, match="needs rdzv_endpoint"):
        hpi.launch(TOY, nnodes=2, job_id="x", home=tmp_path)
    with pytest.raises(ConfigError, match="needs job_id"):
        hpi.launch(TOY, nnodes=2, rdzv_endpoint="127.0.0.1:29400", home=tmp_path)
    with pytest.raises(ConfigError, match="give nnodes too"):
        hpi.launch(TOY, rdzv_endpoint="127.0.0.1:29400", home=tmp_path)
    with pytest.raises(ConfigError, match="resume= or job_id="):
        hpi.launch(TOY, nnodes=2, rdzv_endpoint="127.0.0.1:29400", job_id="x",
                   resume="latest", home=tmp_path)
    with pytest.raises(ConfigError, match="nnodes must be N or MIN:MAX"):
        hpi.launch(TOY, nnodes="two", rdzv_endpoint="127.0.0.1:29400", job_id="x",
                   home=tmp_path)
    with pytest.raises(ConfigError, match="MIN <= MAX"):
        hpi.launch(TOY, nnodes="3:2", rdzv_endpoint="127.0.0.1:29400", job_id="x",
                   home=tmp_path)
    with pytest.raises(ConfigError, match="ip must be an IP address"):
        hpi.launch(TOY, ip="somewhere", home=tmp_path)
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def _listening(endpoint: str) -> bool:
    host, port = endpoint.rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def _nodes(home, endpoint: str, job_id: str, **kw) -> list[hpi.Job]:
    """Two nodes of one job (one rank each) launched into one shared home. The first hosts
    the rendezvous (torchrun's c10d store, as the node named in ``rdzv_endpoint`` does on a
    cluster): the second is launched once it listens, so the second can be lost."""
    nnodes = kw.pop("nnodes", 2)
    first = hpi.launch(TOY, nproc=1, nnodes=nnodes, rdzv_endpoint=endpoint, job_id=job_id,
                       home=home, **kw)
    until(lambda: _listening(endpoint), timeout=60, what="the rendezvous store")
    return [first, hpi.launch(TOY, nproc=1, nnodes=nnodes, rdzv_endpoint=endpoint,
                              job_id=job_id, home=home, **kw)]


def _steps(job: hpi.Job) -> list[int]:
    return [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]


def test_nodes_sharing_a_home_restart_together_when_a_rank_dies(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    jobs = _nodes(tmp_path, endpoint, "shared-restart", max_restarts=1,
                  hparams={"sleep": 0.01, "checkpoint_every": 10},
                  args=["--n", str(N), "--epochs", "2"])  # 64 steps of 16
    assert jobs[0].run_dir.path == jobs[1].run_dir.path  # one run directory for both
    assert len(list(jobs[0].run_dir.nodes_dir.glob("*.json"))) == 2
    wait_for_step(jobs[0], 25, timeout=120)
    [victim] = job_pids(jobs[0].run_dir.path, b"RANK=1")
    os.kill(victim, signal.SIGKILL)
    assert jobs[0].wait(240) == hpi.JobState.FINISHED, jobs[0].logs()[-3000:]
    ev = jobs[0].events()
    [restart] = ev[ev.kind == "restart"].to_dict("records")
    assert (restart["failed_rank"], restart["signal"], restart["restart"]) == (1, "SIGKILL", 1)
    assert restart["step"] == 20  # the newest checkpoint, which every rank read
    assert _steps(jobs[0]) == list(range(64))  # each step once across the restart
    assert jobs[1].state == hpi.JobState.FINISHED


def test_a_lost_node_leaves_the_other_going_with_the_same_global_batch(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    jobs = _nodes(tmp_path, endpoint, "elastic", nnodes="1:2", max_restarts=1,
                  hparams={"sleep": 0.01, "checkpoint_every": 10},
                  args=["--n", str(N), "--epochs", "2"])
    wait_for_step(jobs[0], 25, timeout=120)
    assert jobs[0].status()["world_size"] == 2
    # The second node goes away whole: its supervisor, torchrun's agent and its rank.
    [lost] = [n for n in node_records(jobs[0].run_dir)
              if n["supervisor_pid"] == jobs[1]._proc.pid]
    for pid in job_pids(jobs[0].run_dir.path, f"HPINTERACT_NODE={lost['node']}".encode()):
        os.kill(pid, signal.SIGKILL)
    assert jobs[0].wait(240) == hpi.JobState.FINISHED, jobs[0].logs()[-3000:]
    ev = jobs[0].events()
    [restart] = ev[ev.kind == "restart"].to_dict("records")
    assert (restart["previous_world_size"], restart["world_size"]) == (2, 1)
    # Nothing of the lost node recorded how it ended: the node is named, no rank blamed.
    assert restart["lost_nodes"] == lost["node"] and pd.isna(restart["failed_rank"])
    assert restart["error"].startswith(f"node {lost['node']} was lost")
    assert _steps(jobs[0]) == list(range(64))
    # The same global batch of 16 on one rank: the one left ran every sample of an epoch.
    final = jobs[0].metrics()
    assert set(final.batch_size.dropna()) == {16}


def test_restarts_on_nodes_without_a_shared_home_are_refused_with_the_reason(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    jobs = [hpi.launch(TOY, nproc=1, nnodes=2, rdzv_endpoint=endpoint, job_id="apart",
                       home=tmp_path / f"node{k}", max_restarts=1) for k in (0, 1)]
    for job in jobs:
        assert job.wait(180) == hpi.JobState.FAILED
        assert "needs one run directory that every node shares" in job.error.message


def test_a_node_that_comes_back_joins_at_the_next_rendezvous(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    args = {"max_restarts": 2, "hparams": {"sleep": 0.02, "checkpoint_every": 10},
            "args": ["--n", str(N), "--epochs", "4"]}  # 128 steps of 16
    jobs = _nodes(tmp_path, endpoint, "rejoin", nnodes="1:2", **args)
    wait_for_step(jobs[0], 15, timeout=120)
    [lost] = [n for n in node_records(jobs[0].run_dir)
              if n["supervisor_pid"] == jobs[1]._proc.pid]
    for pid in job_pids(jobs[0].run_dir.path, f"HPINTERACT_NODE={lost['node']}".encode()):
        os.kill(pid, signal.SIGKILL)
    until(lambda: jobs[0].status().get("world_size") == 1, timeout=120, what="one node")
    wait_for_step(jobs[0], 45, timeout=120)
    back = hpi.launch(TOY, nproc=1, nnodes="1:2", rdzv_endpoint=endpoint, job_id="rejoin",
                      home=tmp_path, **args)
    assert back.run_dir.path == jobs[0].run_dir.path
    until(lambda: jobs[0].status().get("world_size") == 2, timeout=120, what="two again")
    assert jobs[0].wait(240) == hpi.JobState.FINISHED, jobs[0].logs()[-3000:]
    ev = jobs[0].events()
    sizes = [(r["previous_world_size"], r["world_size"])
             for r in ev[ev.kind == "restart"].to_dict("records")]
    assert sizes == [(2, 1), (1, 2)]
    assert _steps(jobs[0]) == list(range(128))


def _both(home, endpoint: str, **kw) -> list[hpi.Job]:
    """The same launch call on two nodes of a shared home, the second once the first's
    rendezvous store listens (as ``_nodes`` does)."""
    first = hpi.launch(nproc=1, nnodes=2, rdzv_endpoint=endpoint, home=home, **kw)
    until(lambda: _listening(endpoint), timeout=60, what="the rendezvous store")
    return [first, hpi.launch(nproc=1, nnodes=2, rdzv_endpoint=endpoint, home=home, **kw)]


def test_nodes_resume_a_stopped_job_together_from_its_checkpoint(tmp_path):
    jobs = _nodes(tmp_path, f"127.0.0.1:{free_port()}", "again",
                  hparams={"sleep": 0.01, "checkpoint_every": 10},
                  args=["--n", str(N), "--epochs", "2"])  # 64 steps of 16
    wait_for_step(jobs[0], 12, timeout=120)
    jobs[0].set(lr=0.02)
    ack = jobs[0].checkpoint()
    jobs[0].stop()
    for job in jobs:
        assert job.wait(120) == hpi.JobState.FINISHED, job.logs()[-3000:]
    endpoint = f"127.0.0.1:{free_port()}"
    again = _both(tmp_path, endpoint, resume="again")
    with pytest.raises(ConfigError, match=f"resumed by another node at.*{endpoint}"):
        hpi.launch(resume="again", home=tmp_path, nproc=1, nnodes=2,
                   rdzv_endpoint="127.0.0.1:1")  # a third node, told another meeting point
    assert {j.run_dir.path for j in again} == {jobs[0].run_dir.path}  # the same directory
    assert again[0].wait(240) == hpi.JobState.FINISHED, again[0].logs()[-3000:]
    assert again[1].wait(60) == hpi.JobState.FINISHED
    assert read_json(again[0].run_dir.job_file)["resumes"] == 1
    assert len(node_records(again[0].run_dir)) == 2  # this launch's two nodes, no others
    assert _steps(again[0]) == list(range(64))  # each step once across the resumption
    lrs = {m["step"]: m["lr"] for m in again[0].metrics().to_dict("records")}
    assert lrs[ack.applied_at_step] == 0.02 and lrs[63] == 0.02  # the value in force


def test_a_replay_on_two_nodes_is_one_new_job(tmp_path):
    src = _nodes(tmp_path, f"127.0.0.1:{free_port()}", "src",
                 hparams={"sleep": 0.005}, args=["--n", str(N), "--epochs", "1", "--seed", "0"])
    wait_for_step(src[0], 5, timeout=120)
    ack = src[0].set(lr=0.02)
    for job in src:
        assert job.wait(120) == hpi.JobState.FINISHED, job.logs()[-3000:]
    copy = _both(tmp_path, f"127.0.0.1:{free_port()}", replay="src", job_id="copy")
    assert copy[0].id == "copy" and copy[0].run_dir.path == copy[1].run_dir.path
    assert copy[0].wait(240) == hpi.JobState.FINISHED, copy[0].logs()[-3000:]
    ev = copy[0].events()
    [change] = ev[ev.kind == "change"].to_dict("records")
    assert (change["applied_at_step"], change["values"], change["source"]) == (
        ack.applied_at_step, {"lr": 0.02}, "replay:api")
    first = {m["step"]: m["loss"] for m in read_records(src[0].run_dir.metrics_log)}
    second = {m["step"]: m["loss"] for m in read_records(copy[0].run_dir.metrics_log)}
    assert second == first  # the same losses at the same steps, on two nodes again


def test_nodes_sharing_a_home_resize_together(tmp_path):
    jobs = _nodes(tmp_path, f"127.0.0.1:{free_port()}", "grow",
                  hparams={"sleep": 0.01}, args=["--n", str(N), "--epochs", "2"])
    wait_for_step(jobs[0], 8, timeout=120)
    with pytest.raises(hpi.InvalidHParam, match=r"runs on 2 nodes.*use a multiple of 2"):
        jobs[0].set(workers=3, batch_size=48)  # refused whole: nothing applied
    assert jobs[0].hparams["batch_size"] == 16
    ack = jobs[1].resize(4, timeout=240)  # asked through the other node
    assert jobs[0].status()["world_size"] == 4
    assert read_json(jobs[0].run_dir.job_file)["nproc"] == 2  # per node, on every node
    # Each node's agent started two ranks of the four (its torchrun logs, apart).
    for node in node_records(jobs[0].run_dir):
        logs = jobs[0].run_dir.logs_dir / "torchrun" / node["node"]
        assert {p.name for p in logs.glob("*/attempt_0/*")} >= {"0", "1"}, node
    assert jobs[0].wait(240) == hpi.JobState.FINISHED, jobs[0].logs()[-3000:]
    assert jobs[1].wait(60) == hpi.JobState.FINISHED
    ev = jobs[0].events()
    [done] = ev[(ev.kind == "resize") & (ev.status == "done")].to_dict("records")
    assert (done["from"], done["to"], done["step"]) == (2, 4, ack.applied_at_step)
    assert not len(ev[ev.kind == "restart"])  # a resize, not taken for a failure
    assert _steps(jobs[0]) == list(range(64))
    assert set(jobs[0].metrics().batch_size.dropna()) == {16}


def _own_torchrun(homes: list, endpoint: str, **env: str) -> list[subprocess.Popen]:
    """A user's own ``torchrun --nnodes 2 --max-restarts 1`` on two "nodes", no launcher."""
    torchrun = Path(sys.executable).with_name("torchrun")
    base = {k: v for k, v in os.environ.items() if not k.startswith("HPINTERACT_")}
    # The toy job runs until stopped (torchrun would take a --n after the script for an
    # abbreviation of its own --nnodes).
    return [subprocess.Popen(
        [str(torchrun), "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "own",
         str(TOY)], env={**base, **env, "HPINTERACT_HOME": str(home)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for home in homes]


def test_a_users_own_torchrun_on_two_nodes_restarts_where_they_share_a_home(tmp_path):
    procs = _own_torchrun([tmp_path, tmp_path], f"127.0.0.1:{free_port()}",
                          TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    try:
        until(lambda: len(hpi.jobs(home=tmp_path)) == 1, timeout=120, what="the job")
        job = hpi.attach(hpi.jobs(home=tmp_path)[0].id, home=tmp_path)
        until(lambda: job.run_dir.connection.exists(), timeout=120, what="its coordinator")
        job.set(sleep=0.02, checkpoint_every=10)
        wait_for_step(job, 35, timeout=120)
        [victim] = job_pids(None, f"HPINTERACT_HOME={tmp_path}".encode(), b"RANK=1")
        os.kill(victim, signal.SIGKILL)
        until(lambda: "restart" in set(job.events().get("kind", [])), timeout=120,
              what="the restart")
        [restart] = job.events().query("kind == 'restart'").to_dict("records")
        wait_for_step(job, restart["step"] + 10, timeout=120)
        job.stop()
        for p in procs:
            assert p.wait(120) == 0, p.stdout.read().decode()[-3000:]
    finally:
        for p in procs:
            p.terminate()  # torchrun's agent ends its ranks too (a kill would orphan them)
    # No supervisor saw the signal and a SIGKILLed rank writes nothing: told, blaming no one.
    assert restart["failed_kind"] == "lost_peer" and pd.isna(restart["failed_rank"])
    assert "lost a peer that left no record of its own" in restart["error"]
    assert restart["step"] in {c["step"] for c in job.checkpoints()}  # from the newest
    steps = _steps(job)
    assert steps == list(range(len(steps)))  # each step once across the restart


def test_a_users_own_torchrun_on_two_nodes_with_one_store_is_refused_restarts(tmp_path):
    """torchrun's agents count restarts apart, so under one store for every round the
    restarted ranks could not meet: refused at once, saying what makes it work. (Nodes
    without a shared home are refused as under hpi.launch, above; on one machine a rank
    can read rank 0's directory, so the test cannot make them apart here.)"""
    procs = _own_torchrun([tmp_path] * 2, f"127.0.0.1:{free_port()}")
    outs = [p.communicate(timeout=240)[0].decode() for p in procs]
    assert all(p.returncode != 0 for p in procs)
    assert all("set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every node's environment" in out
               for out in outs), outs[0][-3000:]
