"""The fault table: every failure scenario on a real 2-rank job, one row each: how long
until it was told, whom it blamed, whether the job restarted, the steps lost and the log
records lost (which must be 0).

Runs in: a driver process (a client of the jobs; it never imports torch). The job is the
tests' toy DDP job (tests/jobs/toy.py), 2 ranks on gloo. Faults come from outside (a
signal to one rank's process, found by its environment) or from the script at a chosen
step (an exception, an exit code, a hang in the script's own code).

Columns: ``told s`` is from the fault to the job's terminal state (or, with restarts, to
the restart event); for a hang, from the last step the job logged. ``blamed`` is
``job.error`` (or the restart event's cause). A row fails when the rank or the kind blamed
is not the one the fault hit, when a job that should restart did not, or when any log
record is missing or repeated; the script then exits non-zero.

The multi-node rows run two torchrun agents on this machine's loopback as two nodes of one
rank each, sharing one home (as a cluster's network file system): a rank of the second
node killed, the second node killed whole (its supervisor, agent and rank) with an elastic
range ``nnodes="1:2"``, and that node launched again, which must join at the next
rendezvous (``told`` is then from its launch to the job training on two nodes again).

Usage: .venv/bin/python benchmarks/faults.py [--only "kill -9 rank 1;2 nodes"] (a scenario runs
where its name starts with one of the ;-separated parts)
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import job_env, machine_facts, private_home

import hpinteract as hpi
from hpinteract.client.history import read_records
from hpinteract.client.nodes import node_records

TOY = Path(__file__).resolve().parents[1] / "tests" / "jobs" / "toy.py"
HANG_TIMEOUT = 3.0


@dataclass
class Scenario:
    name: str
    rank: int | None  # the rank the fault hits (None: a whole node, whose ranks and agent
    # leave no record: the blame names the node lost, no rank)
    kind: str  # what the blame must say (protocol/failures.py's kinds)
    args: list[str] = field(default_factory=list)
    signal: int | None = None  # sent from outside once the job trains
    restarts: int = 0
    nodes: str | None = None  # two nodes sharing a home: torchrun's --nnodes
    whole_node: bool = False  # the signal goes to every process of the second node
    back: bool = False  # then the second node is launched again


SCENARIOS = [
    Scenario("kill -9 rank 1", 1, "signal", signal=signal.SIGKILL),
    Scenario("kill -9 rank 0", 0, "signal", signal=signal.SIGKILL),
    Scenario("kill -TERM rank 1", 1, "stopped", signal=signal.SIGTERM),
    Scenario("rank 1 raises", 1, "exception", ["--crash-rank", "1", "--crash-step", "30"]),
    Scenario("rank 1 exits 3", 1, "exit", ["--crash-rank", "1", "--crash-step", "30",
                                           "--exit", "3"]),
    Scenario("rank 0 exits 3", 0, "exit", ["--crash-rank", "0", "--crash-step", "30",
                                           "--exit", "3"]),
    Scenario("rank 1 hangs", 1, "hang", ["--crash-rank", "1", "--crash-step", "30",
                                         "--hang", "inf"]),
    Scenario("kill -9 rank 1, restarts", 1, "signal", signal=signal.SIGKILL, restarts=1),
    Scenario("rank 1 hangs, restarts", 1, "hang", ["--crash-rank", "1", "--crash-step", "30",
                                                   "--hang", "inf"], restarts=1),
    Scenario("2 nodes: kill -9 rank 1 (node 2), restarts", 1, "signal",
             signal=signal.SIGKILL, restarts=1, nodes="2"),
    Scenario("2 nodes: node 2 killed whole, nnodes=1:2", None, "lost_peer",
             signal=signal.SIGKILL, restarts=2, nodes="1:2", whole_node=True, back=True),
]


def pids(run_dir: Path, *also: bytes) -> list[int]:
    """The processes of this run directory (they carry it in their environment) whose
    environment also holds each of ``also`` (``b"RANK=1"``)."""
    want = {f"HPINTERACT_RUN_DIR={run_dir}".encode(), *also}
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                env = set((p / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if want <= env:
                found.append(int(p.name))
    if not found:
        raise RuntimeError(f"no process with {also} under {run_dir}")
    return found


def free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def listening(host: str, port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0


def launch_nodes(s: Scenario, **kw: Any) -> list[hpi.Job]:
    """Two nodes of one job, one rank each, in one home; the second once the first's
    rendezvous store listens (so that the second can be lost)."""
    endpoint = free_endpoint()
    host, port = endpoint.rsplit(":", 1)
    kw.update(nproc=1, nnodes=s.nodes, rdzv_endpoint=endpoint,
              job_id=f"nodes-{len(list((kw['home'] / 'jobs').glob('nodes-*')))}")
    first = hpi.launch(TOY, **kw)
    deadline = time.monotonic() + 60
    while not listening(host, int(port)):
        if time.monotonic() > deadline:
            raise RuntimeError("the first node's rendezvous store never listened")
        time.sleep(0.05)
    return [first, hpi.launch(TOY, **kw)]


def wait_step(job: hpi.Job, step: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (job.status().get("latest") or {}).get("step", -1) >= step:
            return
        time.sleep(0.02)
    raise RuntimeError(f"job {job.id} did not reach step {step}")


def records_lost(job: hpi.Job, total: int | None) -> int:
    """Steps missing from (or repeated in) the metrics log: 0..last once each, and with a
    known length (a job that finished) all of them."""
    steps = [m["step"] for m in read_records(job.run_dir.metrics_log) if not m.get("eval")]
    want = range(total if total is not None else (max(steps) + 1 if steps else 0))
    return len(set(want) - set(steps)) + (len(steps) - len(set(steps)))


def fault(s: Scenario, job: hpi.Job, nodes: list[hpi.Job]) -> float:
    """Send the scenario's signal once the job trains; the time it was sent."""
    wait_step(job, 30)
    if s.whole_node:
        proc = nodes[1]._proc  # the second node's supervisor, which this driver started
        assert proc is not None
        [node] = [n["node"] for n in node_records(job.run_dir)
                  if n["supervisor_pid"] == proc.pid]
        targets = pids(job.run_dir.path, f"HPINTERACT_NODE={node}".encode())
    else:
        targets = pids(job.run_dir.path, f"RANK={s.rank}".encode())
    t0 = time.time()
    for pid in targets:
        os.kill(pid, s.signal or signal.SIGKILL)
    return t0


def come_back(job: hpi.Job, kw: dict[str, Any]) -> float:
    """The lost node launched again with the same call, once the other goes on alone; the
    time of that launch."""
    deadline = time.monotonic() + 120
    while job.status().get("world_size") != 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the job never went on with one node")
        time.sleep(0.05)
    wait_step(job, int((job.status().get("latest") or {}).get("step", 0)) + 15)
    t = time.time()
    spec = job.spec
    hpi.launch(TOY, nproc=1, nnodes=spec["nnodes"], rdzv_endpoint=spec["rdzv_endpoint"],
               job_id=job.id, **kw)
    return t


def run(s: Scenario, home: Path) -> list[dict[str, Any]]:
    steps = 256 if s.back else 64  # a restarted job finishes; one that grows back too
    kw: dict[str, Any] = {
        "home": home, "env": job_env(), "max_restarts": s.restarts,
        "hparams": {"sleep": 0.02 if s.nodes else 0.01, "hang_timeout": HANG_TIMEOUT,
                    "checkpoint_every": 10},
        "args": [*s.args, "--n", str(16 * steps), "--epochs", "1"]}
    nodes = launch_nodes(s, **kw) if s.nodes else []
    job = nodes[0] if nodes else hpi.launch(TOY, nproc=2, **kw)
    t0 = fault(s, job, nodes) if s.signal is not None else None
    back_at = come_back(job, kw) if s.back else None
    state = job.wait(240)
    ev = job.events()
    restarts = ev[ev.kind == "restart"].to_dict("records") if "kind" in ev else []
    rows = [judge(s, job, state, restarts, ev, t0, steps)]
    if back_at is not None:
        rows.append(rejoined(job, state, restarts, back_at, steps))
    return rows


def judge(s: Scenario, job: hpi.Job, state: hpi.JobState, restarts: list[dict[str, Any]],
          ev: Any, t0: float | None, steps: int) -> dict[str, Any]:
    if restarts:
        r = restarts[0]
        blamed, rank, kind = str(r["error"]), r["failed_rank"], r["failed_kind"]
        rank = None if rank is None or rank != rank else int(rank)  # NaN: no rank named
        told_at, lost = float(r["time"]), int(r["steps_lost"])
    else:
        err = job.error
        blamed = str(err) if err is not None else "-"
        rank, kind = (err.rank, err.kind) if err is not None else (None, None)
        ended = ev[(ev.kind == "state") & (ev.state == state.value)]
        told_at, lost = float(ended.time.iloc[-1]), 0
    if t0 is None:  # the fault came from the script: from the last step before it
        before = [m for m in read_records(job.run_dir.metrics_log) if not m.get("eval")
                  and m["step"] < 30]
        t0 = float(before[-1]["time"]) if before else told_at
    total = steps if state == hpi.JobState.FINISHED else None
    row = {"scenario": s.name, "told_s": told_at - t0, "blamed": blamed, "rank": rank,
           "kind": kind, "restarted": bool(restarts), "state": state.value,
           "steps_lost": lost, "records_lost": records_lost(job, total)}
    row["ok"] = (rank == s.rank and kind == s.kind and row["records_lost"] == 0
                 and row["restarted"] == bool(s.restarts)
                 and state == (hpi.JobState.FINISHED if s.restarts else hpi.JobState.FAILED))
    if s.whole_node:  # and the job went on without it: the same global batch on one rank
        row["ok"] = row["ok"] and (restarts[0].get("previous_world_size"),
                                   restarts[0].get("world_size")) == (2, 1) \
            and bool(restarts[0].get("lost_nodes")) and "was lost" in blamed
    return row


def rejoined(job: hpi.Job, state: hpi.JobState, restarts: list[dict[str, Any]],
             back_at: float, steps: int) -> dict[str, Any]:
    """The row of a node that came back: from its launch to the job training with it."""
    grown = [r for r in restarts if (r.get("previous_world_size"), r.get("world_size"))
             == (1, 2)]
    told = float(grown[0]["time"]) - back_at if grown else float("nan")
    lost = records_lost(job, steps if state == hpi.JobState.FINISHED else None)
    return {"scenario": "2 nodes: node 2 launched again, joins", "told_s": told,
            "blamed": "- (a node joined: world size 1 -> 2)", "rank": None, "kind": None,
            "restarted": bool(grown), "state": state.value,
            "steps_lost": int(grown[0]["steps_lost"]) if grown else 0, "records_lost": lost,
            "ok": bool(grown) and lost == 0 and state == hpi.JobState.FINISHED}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="scenarios whose names start with one of "
                    "these ;-separated parts")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    parts = [p.strip() for p in a.only.split(";") if p.strip()]
    chosen = [s for s in SCENARIOS if not parts or any(s.name.startswith(p) for p in parts)]
    home = private_home(a.keep)
    print(machine_facts())
    print(f"faults: the toy job, 2 ranks on gloo/CPU, hang_timeout={HANG_TIMEOUT:g}s, "
          "checkpoint_every=10\n", flush=True)
    rows = []
    for s in chosen:
        new = run(s, home)
        rows += new
        for r in new:
            print(f"{r['scenario']:<26} told {r['told_s']:6.2f}s  "
                  f"restarted {r['restarted']!s:<5} steps lost {r['steps_lost']:<3} "
                  f"records lost {r['records_lost']:<2} {'ok' if r['ok'] else 'WRONG'}\n"
                  f"    blamed: {r['blamed'][:160]}",
                  flush=True)
    print("\n| scenario | told (s) | blamed | restarted | steps lost | records lost |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        blamed = r["blamed"].split(";")[0]
        print(f"| {r['scenario']} | {r['told_s']:.2f} | {blamed[:90]} | "
              f"{'yes' if r['restarted'] else 'no'} | {r['steps_lost']} | "
              f"{r['records_lost']} |")
    wrong = [r["scenario"] for r in rows if not r["ok"]]
    if wrong:
        sys.exit(f"faults: wrong blame, restart or lost records in: {', '.join(wrong)}")


if __name__ == "__main__":
    main()
