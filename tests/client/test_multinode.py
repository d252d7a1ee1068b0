"""A job on two "nodes": two torchrun agents on this machine's loopback, each launched with
its own HPINTERACT_HOME (as two machines without a shared file system), meeting through
the c10d rendezvous. A client on either node reaches rank 0's coordinator, wherever the
rendezvous put it, and a change applies on all four ranks at the same step."""

from __future__ import annotations

import json
import socket

import pytest
from helpers import TOY, wait_for_step

import hpinteract as hpi
from hpinteract.protocol.errors import ConfigError

N = 512  # 32 steps an epoch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    with pytest.raises(ConfigError, match="a job on several nodes cannot use them yet"):
        hpi.launch(TOY, nnodes=2, rdzv_endpoint="127.0.0.1:29400", job_id="x",
                   max_restarts=1, home=tmp_path)
    with pytest.raises(ConfigError, match="ip must be an IP address"):
        hpi.launch(TOY, ip="somewhere", home=tmp_path)
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())
