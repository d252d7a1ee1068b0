"""Load: 16 live subscribers and 100 ``job.set()`` calls a second against a 2-rank job.

Runs in: a driver process on the machine under test, which launches the benchmarks' DDP job
(``hpi.launch(train.py --mode hpi --steps 0)``, 2 ranks on gloo/CPU, OMP_NUM_THREADS=1; see
train.py) once per variant and run, and starts the clients: subscriber processes (spawned,
each with a Job of its own from ``hpi.attach``, as 16 notebooks would be; ``--clients
threads`` puts them in threads of the driver instead) and, in the driver, a setter.

Goal (the issue): "16 concurrent subscribers and 100 ``set()`` calls a second for 30 s
against a 2-rank job: every acknowledgement arrives, the logs lose nothing, and training
throughput stays at least 90 % of the idle figure. A slow or stuck subscriber never slows
training (PUB drops for it; it catches up from the log)."

The clients and the setter run in Linux's SCHED_IDLE class (``--client-priority``), the
job at the machine's default: on the 2-core development box the two ranks need both
cores, and whatever CPU a client process takes is taken from a rank (and, the ranks being
in lock-step, from both), which says nothing about what the job's control plane costs. A
real deployment has the notebook on other cores or another machine. ``shared`` runs the
same load at the job's own priority, so that the machine's cost is shown side by side.

Variants, the same job each time, run side by side in every round, the order flipped each
round (idle load stuck | stuck load idle | ...), so that the load of a shared machine falls
on all alike:

- ``idle``: nobody attached;
- ``load``: ``--subscribers`` (16) clients iterating ``job.stream()`` from launch to the
  job's end, and a setter calling ``job.set(lr=...)`` (alternating 0.05 and 0.045) at
  ``--rate`` (100) calls a second, paced (call i is due at t0 + i/rate; a pool of threads
  makes them, since each call waits for its step boundary), for ``--seconds`` (30);
- ``shared``: ``load`` with the clients and the setter at the job's priority;
- ``load-setter`` and ``load-subscribers``: the two halves of ``load``, its setter alone
  and its subscribers alone, to say which costs what;
- ``burn``: the control, with no hpinteract client at all: ``--subscribers`` + 1 processes
  in the clients' class that wake ``--burn-hz`` times a second each and decode JSON for
  their share of ``--burn-cores`` (by default about what the load's clients and setter
  take here), until the job ends. What any other work of that volume costs the ranks on
  the cores they share;
- ``stuck``: ``load`` plus two bad clients. A stuck one: a raw ZeroMQ SUB socket
  (RCVHWM 1, a small kernel buffer) that connects and never reads, so the job's PUB socket
  has to drop for it; after the window it reads what its socket holds (a gap in it shows
  the drop), closes it and catches up with ``job.stream()`` from seq 0 while the job runs.
  A slow one: ``job.stream()`` whose subscriber socket has a small RCVHWM and sleeps
  ``--slow-ms`` (200) before every read of the socket, so it falls behind, is dropped for,
  and fills each gap from the job's history (the clone pattern of transport.pubsub).

Throughput is taken from the job's own metrics log over the window (the ``--seconds``
after warm-up, clients live and a settling second): steps/s and the median step_time. The
verdict is the per-round ratio load/idle and stuck/idle (median over rounds, goal >= 0.90),
never an absolute time; stuck/load says what the two bad clients alone cost.

Checks after each run (a violation is listed and makes the exit status 1):

- every ``set()`` returned an Ack (rate x seconds of them), with distinct change ids;
- the events log has one ``applied`` change event per ack id, at the ack's step and with
  its values, and no rejected or cancelled change; every rank applied each at that step;
- the metrics log has every step exactly once (0..N-1 in order), and seqs are unique;
- every subscriber (the 16, the slow one and the stuck one) got every record of the
  logs exactly once, in seq order, with the same content (a digest of each record).

Also reported: CPU used over the window by the job, the clients, the driver and the rest
of the machine (other people's work: the machine is shared), the stream delay step end ->
subscriber, and set() latency and pacing.

Usage: .venv/bin/python benchmarks/load.py [--seconds 30] [--rounds 2] [--rate 100]
       [--subscribers 16] [--clients processes|threads] [--client-priority idle]
       [--variants idle,load,stuck,shared]
       (``--seconds 10`` for a quick run; the default takes about 5 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import OUT, TRAIN, job_env, machine_facts, median, pct, private_home, round_ratios
from overhead import CPU_GROUPS, cpu_groups

import hpinteract as hpi
from hpinteract.client import channel, history
from hpinteract.client.bulk import last_record

GOAL = 0.90
POOL_SIZE = channel.POOL_SIZE
# The same with the coordinator run otherwise: "-thread" a thread of rank 0 (the default,
# named), "-process" a process of its own 10 below the ranks' priority (settings.DEFAULT_NICE),
# "-nice0" and "-nice19" that process at the job's own priority or at the lowest.
PROCESS = {"HPINTERACT_COORDINATOR": "process"}
MODES = {"-thread": {"HPINTERACT_COORDINATOR": "thread"},
         "-process": PROCESS,
         "-nice0": {**PROCESS, "HPINTERACT_COORDINATOR_NICE": "0"},
         "-nice19": {**PROCESS, "HPINTERACT_COORDINATOR_NICE": "19"},
         # The job as in "load"; the setter opens a socket (a TCP connection and a ZeroMQ
         # handshake) per set(), as every client did before command sockets were pooled.
         "-fresh": {}}
# Where a load's cost comes from, side by side with it: its setter alone (no subscriber)
# and its subscribers alone (no set()).
PARTS = ("load-setter", "load-subscribers")
VARIANTS = ("idle", "load", "stuck", "shared", "burn", *PARTS,
            *(f"{k}{m}" for m in MODES for k in ("idle", "load")))
LRS = (0.05, 0.045)  # train.py starts at 0.05
SOURCE = "bench-load"
LIVE_S = 1.0  # a record that arrives within this of its time is live, not history
TICK = os.sysconf("SC_CLK_TCK")


# ---- clients (subscriber processes or threads) ----------------------------------------------
def canonical(rec: dict[str, Any]) -> bytes:
    return json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()


def summary_of(recs: list[dict[str, Any]], arrive: list[float]) -> dict[str, Any]:
    """What a client got, computed after the job ended (no hashing while it trains): the seqs
    in order, a digest of the records' content, and each metric's (time, arrival)."""
    h = hashlib.sha256()
    for r in recs:
        h.update(canonical(r))
        h.update(b"\n")
    times = [(float(r["time"]), t) for r, t in zip(recs, arrive, strict=True)
             if "step" in r and "kind" not in r]
    return {"seqs": [int(r["seq"]) for r in recs], "digest": h.hexdigest(), "times": times}


def follow(job: Any, idx: int, q: Any, after: float = 0.0,
           release: Any = None) -> dict[str, Any]:
    """Iterate ``job.stream()`` to the end; say "live" on the first live record after
    ``after``, and (with ``release``) again on the first one once it is set."""
    recs: list[dict[str, Any]] = []
    arrive: list[float] = []
    waiting = True
    for rec in job.stream(idle_s=0.2):
        now = time.time()
        recs.append(rec)
        arrive.append(now)
        if release is not None and not waiting and release.is_set():
            waiting, after, release = True, now, None
        if waiting and float(rec.get("time", 0.0)) >= after and now - float(rec["time"]) < LIVE_S:
            waiting = False
            q.put(("live", idx, now))
    return summary_of(recs, arrive)


def stream_client(idx: int, job_id: str, home: str, q: Any, release: Any,
                  opts: dict[str, Any]) -> dict[str, Any]:
    return follow(hpi.attach(job_id, home=home), idx, q)


def slow_client(idx: int, job_id: str, home: str, q: Any, release: Any,
                opts: dict[str, Any]) -> dict[str, Any]:
    """``job.stream()`` with a subscriber that reads slowly and queues little until
    ``release``, then at full speed (its own process: the Subscriber class of
    hpinteract.client.stream is replaced here only)."""
    import zmq

    import hpinteract.client.stream as stream_mod
    from hpinteract.protocol.codec import MAX_MESSAGE_BYTES, Codec
    from hpinteract.protocol.messages import TOPIC_RECORDS
    from hpinteract.transport.curve import secure_client
    from hpinteract.transport.pubsub import Subscriber

    live_seqs: list[int] = []

    class SlowSubscriber(Subscriber):
        def __init__(self, ctx: Any, url: str, key: bytes, server_key: bytes | None = None):
            # Subscriber.__init__ with a small RCVHWM and kernel buffer, set before connect.
            self.codec = Codec(key)
            self.socket = ctx.socket(zmq.SUB)
            secure_client(self.socket, server_key)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            self.socket.setsockopt(zmq.RCVHWM, opts["slow_hwm"])
            self.socket.setsockopt(zmq.RCVBUF, 4096)
            self.socket.setsockopt(zmq.SUBSCRIBE, TOPIC_RECORDS)
            self.socket.connect(url)

        def recv(self, timeout_s: float) -> list[dict[str, Any]] | None:
            if not release.is_set():
                time.sleep(opts["slow_ms"] / 1e3)
            batch = super().recv(timeout_s)
            live_seqs.extend(int(r.get("seq", 0)) for r in batch or ())
            return batch

    stream_mod.Subscriber = SlowSubscriber  # type: ignore[misc]
    out = follow(hpi.attach(job_id, home=home), idx, q, release=release)
    got = set(out["seqs"])
    live = [s for s in live_seqs if s in got]
    out["slow"] = {"live_messages_records": len(live_seqs),
                   "live_gaps": sum(1 for a, b in itertools.pairwise(live) if b > a + 1),
                   "from_history": len(got - set(live_seqs))}
    return out


def stuck_client(idx: int, job_id: str, home: str, q: Any, release: Any,
                 opts: dict[str, Any]) -> dict[str, Any]:
    """A raw SUB socket that never reads until ``release``; then what it held, and a
    catch-up with ``job.stream()`` from the start."""
    import zmq

    from hpinteract.protocol.codec import Codec
    from hpinteract.protocol.connection import ConnectionInfo
    from hpinteract.protocol.messages import TOPIC_RECORDS
    from hpinteract.transport.curve import secure_client

    job = hpi.attach(job_id, home=home)
    while not job.run_dir.connection.exists():
        time.sleep(0.05)
    info = ConnectionInfo.read(job.run_dir.connection)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    secure_client(sock, info.server_key)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 1024)
    sock.setsockopt(zmq.SUBSCRIBE, TOPIC_RECORDS)
    sock.connect(info.pub_url)
    sock.poll(60_000)  # a message waits: connected (and it stays unread)
    q.put(("live", idx, time.time()))
    release.wait()
    released = time.time()
    # What its socket holds: the first messages, then (after the PUB dropped) live ones.
    codec, seqs, messages, gaps = Codec(info.key_bytes), [], 0, []
    t_end = time.monotonic() + 5.0
    while not gaps and time.monotonic() < t_end and sock.poll(300):
        _, msg = codec.unpack(sock.recv_multipart(), topic=True)
        messages += 1
        seqs.extend(int(r["seq"]) for r in msg.content.get("records", []))
        gaps = [(a, b) for a, b in itertools.pairwise(seqs[-200:]) if b > a + 1]
    sock.close()
    t = time.monotonic()
    out = follow(job, idx, q, after=released)
    out["stuck"] = {"held_messages": messages, "held_first_seq": seqs[0] if seqs else None,
                    "first_gap": gaps[0] if gaps else None, "catch_up_s": time.monotonic() - t}
    return out


def burn_client(idx: int, job_id: str, home: str, q: Any, release: Any,
                opts: dict[str, Any]) -> dict[str, Any]:
    """No hpinteract client: wakes ``burn_hz`` times a second and decodes JSON (work with a
    subscriber's memory footprint) for its share of ``burn_cores``, until the job ends."""
    job = hpi.attach(job_id, home=home)
    blob = json.dumps([{"step": i, "loss": 1.0 / (i + 1), "lr": 0.05, "time": time.time()}
                       for i in range(16)])
    period = 1.0 / opts["burn_hz"]
    share = opts["burn_cores"] / opts["burn_procs"]
    q.put(("live", idx, time.time()))
    start = due = checked = time.monotonic()
    cpu0 = time.process_time()
    while True:
        due += period
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        else:  # behind (preempted): the next wake-up from now, not a burst to catch up
            due = time.monotonic()
        # Up to its share of the time since the start, all this process's CPU counted (the
        # wake-ups' too), so that the variant takes the cores it says.
        until = cpu0 + share * (time.monotonic() - start)
        while time.process_time() < until:
            json.loads(blob)
        if due - checked > 1.0:
            checked = due
            if job.state.terminal:
                return {"seqs": [], "burn": True}


CLIENTS = {"stream": stream_client, "slow": slow_client, "stuck": stuck_client,
           "burn": burn_client}


def lower_priority(idle: bool, tid: int = 0) -> None:
    """This thread (or ``tid``, a process) in Linux's SCHED_IDLE class: it runs only on a
    core nobody else wants, which nice 19 does not ensure (measured: no better than nice 0).
    Lowering one's own class needs no privilege. Never the driver's main thread: the jobs it
    launches would inherit it."""
    if idle:
        os.sched_setscheduler(tid or threading.get_native_id(), os.SCHED_IDLE,
                              os.sched_param(0))


def zmq_threads() -> list[int]:
    """The thread ids of this process's ZeroMQ I/O threads (Linux)."""
    out = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            if (task / "comm").read_text().startswith("ZMQbg"):
                out.append(int(task.name))
    return out


def client_main(kind: str, idx: int, job_id: str, home: str, q: Any, release: Any,
                opts: dict[str, Any]) -> None:
    # A process: before zmq starts its I/O thread, which inherits the class.
    lower_priority(opts["idle"])
    cpu0 = time.process_time() if opts["process"] else time.thread_time()
    try:
        res = CLIENTS[kind](idx, job_id, home, q, release, opts)
    except BaseException:  # reported by the driver
        res = {"error": traceback.format_exc()}
    res["cpu_s"] = (time.process_time() if opts["process"] else time.thread_time()) - cpu0
    q.put(("done", idx, res))


# ---- CPU accounting over the window (Linux /proc) -------------------------------------------
def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in task.read_text().split())
    return out


def cpu_s(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return total / TICK


def machine_busy_s() -> tuple[float, float]:
    """CPU seconds the machine spent busy (user, system, irq: every local process and the
    kernel) and stolen by the hypervisor (other virtual machines), summed over cores."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    f += [0] * (8 - len(f))
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / TICK, f[7] / TICK


# ---- the setter -----------------------------------------------------------------------------
def run_setter(job: Any, seconds: float, rate: float, workers: int,
               idle: bool) -> list[dict[str, Any]]:
    """``rate`` calls a second for ``seconds``, paced; returns one record per call."""
    n = round(seconds * rate)

    def one(i: int, due: float) -> dict[str, Any]:
        t = time.monotonic()
        try:
            ack = job.set(lr=LRS[i % 2], source=SOURCE)
        except Exception as exc:
            return {"i": i, "due": due, "start": t, "end": time.monotonic(), "error": repr(exc)}
        return {"i": i, "due": due, "start": t, "end": time.monotonic(), "id": ack.change_id,
                "step": ack.applied_at_step, "values": ack.values}

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="setter",
                              initializer=lower_priority, initargs=(idle,))
    t0 = time.monotonic()
    futures = []
    for i in range(n):
        due = t0 + i / rate
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        futures.append(pool.submit(one, i, due))
    out = [f.result() for f in futures]  # each set() has its own timeouts
    pool.shutdown()
    return out


# ---- one run --------------------------------------------------------------------------------
class Clients:
    """The subscribers of one run, in processes (spawned) or threads."""

    def __init__(self, a: argparse.Namespace, job_id: str, home: Path,
                 kinds: list[str], idle: bool) -> None:
        self.kinds = kinds
        self.procs: list[Any] = []
        opts = {"slow_ms": a.slow_ms, "slow_hwm": a.slow_hwm, "idle": idle,
                "burn_hz": a.burn_hz, "burn_cores": a.burn_cores, "burn_procs": len(kinds)}
        ctx = mp.get_context("spawn")
        # The bad clients patch a module or hold a raw socket: always a process of their own.
        use_proc = [a.clients == "processes" or k != "stream" for k in kinds]
        self.q: Any = ctx.Queue() if any(use_proc) else queue.Queue()
        self.release: Any = ctx.Event() if any(use_proc) else threading.Event()
        for i, (k, proc) in enumerate(zip(kinds, use_proc, strict=True)):
            args = (k, i, job_id, str(home), self.q, self.release, {**opts, "process": proc})
            p = ctx.Process(target=client_main, args=args, daemon=True) if proc else \
                threading.Thread(target=client_main, args=args, daemon=True, name=f"sub-{i}")
            p.start()
            self.procs.append(p)
        self.live: dict[int, float] = {}
        self.results: dict[int, dict[str, Any]] = {}

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if isinstance(p, mp.process.BaseProcess)]

    def pump(self, timeout: float) -> None:
        try:
            what, idx, payload = self.q.get(timeout=timeout)
        except queue.Empty:
            return
        if what == "live":
            self.live[idx] = payload
        else:
            self.results[idx] = payload

    def wait_live(self, idxs: list[int], deadline: float, after: float = 0.0) -> bool:
        while not all(self.live.get(i, 0.0) > after for i in idxs):
            if time.monotonic() > deadline:
                return False
            if i_failed := [i for i in idxs if i in self.results]:
                sys.exit(f"client {i_failed[0]} ended early: "
                         f"{self.results[i_failed[0]].get('error')}")
            self.pump(0.1)
        return True

    def collect(self, deadline: float) -> None:
        while len(self.results) < len(self.procs) and time.monotonic() < deadline:
            self.pump(0.2)
        for p in self.procs:
            p.join(max(0.1, deadline - time.monotonic()))
            if isinstance(p, mp.process.BaseProcess) and p.is_alive():
                p.terminate()
                p.join(5)


def idle_of(a: argparse.Namespace, v: str) -> bool:
    """Whether the clients and the setter run in SCHED_IDLE: not for ``shared``."""
    return v != "shared" and a.client_priority == "idle"


def kind_of(v: str) -> str:
    return v.split("-")[0]


def env_of(v: str) -> dict[str, str]:
    mode = v[len(kind_of(v)):]
    return {**job_env(), **MODES.get(mode, {})}


def run_once(a: argparse.Namespace, v: str, home: Path) -> dict[str, Any]:
    deadline = time.monotonic() + a.timeout
    out = OUT / f"load-{v}-job.json"
    out.unlink(missing_ok=True)
    job = hpi.launch(TRAIN, nproc=a.nproc, env=env_of(v), home=home,
                     args=["--mode", "hpi", "--steps", "0", "--warmup", str(a.warmup),
                           "--out", str(out)])
    if v == "burn":  # as many processes as the load's subscribers and setter
        kinds = ["burn"] * (a.subscribers + 1)
    else:
        subscribers = 0 if kind_of(v) == "idle" or v == "load-setter" else a.subscribers
        kinds = ["stream"] * subscribers + (["slow", "stuck"] if v == "stuck" else [])
    clients = Clients(a, job.id, home, kinds, idle_of(a, v)) if kinds else None
    try:
        rec = measure(a, v, job, clients, home, deadline)
        if out.exists():  # rank 0's CPU by thread, from its warm-up to the stop
            rec["rank_threads_ms_per_step"] = json.loads(out.read_text())[
                "rank_threads_ms_per_step"]
        return rec
    finally:
        if not job.state.terminal:
            try:
                job.stop()
                job.wait(timeout=60)
            except hpi.HpiError:
                pass
        if clients is not None:
            clients.collect(time.monotonic() + 10)


def measure(a: argparse.Namespace, v: str, job: Any, clients: Clients | None, home: Path,
            deadline: float) -> dict[str, Any]:
    metrics_log = job.run_dir.metrics_log
    while (m := last_record(metrics_log)) is None or int(m["step"]) < a.warmup:
        if job.state.terminal or time.monotonic() > deadline:
            sys.exit(f"{v}: job {job.id} did not reach step {a.warmup}: {job.state.value} "
                     f"{job.error or ''}\n{job.logs()[-3000:]}")
        if clients is not None:
            clients.pump(0.05)
        else:
            time.sleep(0.05)
    if clients is not None and not clients.wait_live(list(range(len(clients.kinds))), deadline):
        sys.exit(f"{v}: only {len(clients.live)} of {len(clients.kinds)} clients went live")
    time.sleep(a.settle)  # the clients' start-up and first catch-up are over

    setter = kind_of(v) not in ("idle", "burn") and v != "load-subscribers"
    setter_job = hpi.attach(job.id, home=home) if setter else None
    channel.POOL_SIZE = 0 if v.endswith("-fresh") else POOL_SIZE
    job_pids = tree(job._proc.pid)
    client_pids = clients.pids() if clients else []
    c0 = (cpu_s(job_pids), cpu_s(client_pids), time.process_time(), machine_busy_s())
    t0, m0 = time.time(), time.monotonic()
    calls: list[dict[str, Any]] = []
    if setter_job is not None:
        # In the driver's main thread; client results queue up meanwhile (read afterwards).
        # The driver's ZeroMQ threads carry the setter's traffic: in the setter's class too
        # (they were created by whichever thread first used the context, at its class).
        setter_job.status()
        for tid in zmq_threads():
            os.sched_setscheduler(tid, os.SCHED_IDLE if idle_of(a, v) else os.SCHED_OTHER,
                                  os.sched_param(0))
        calls = run_setter(setter_job, a.seconds, a.rate, a.setter_threads, idle_of(a, v))
    else:
        time.sleep(a.seconds)
    t1 = t0 + a.seconds
    wall = time.monotonic() - m0
    c1 = (cpu_s(job_pids), cpu_s(client_pids), time.process_time(), machine_busy_s())

    rec: dict[str, Any] = {"variant": v, "job_id": job.id, "t0": t0, "t1": t1,
                           "load_avg": os.getloadavg()[0], "window_wall_s": wall}
    busy, steal = c1[3][0] - c0[3][0], c1[3][1] - c0[3][1]
    mine = (c1[0] - c0[0]) + (c1[1] - c0[1]) + (c1[2] - c0[2])
    rec["cpu_cores"] = {"job": (c1[0] - c0[0]) / wall, "clients": (c1[1] - c0[1]) / wall,
                        "driver": (c1[2] - c0[2]) / wall, "machine": busy / wall,
                        "others": max(0.0, busy - mine) / wall, "steal": steal / wall}
    rec["job_cpu_s"] = c1[0] - c0[0]

    bad = [i for i, k in enumerate(clients.kinds) if k in ("stuck", "slow")] if clients else []
    if clients is not None and bad:
        # The stuck one starts reading, the slow one reads at full speed: both must catch up
        # (from the history) while the job runs on.
        t_rel = time.time()
        clients.release.set()
        if not clients.wait_live(bad, time.monotonic() + a.catch_up_timeout, after=t_rel):
            rec.setdefault("failures", []).append(
                f"the stuck and slow subscribers did not both catch up within "
                f"{a.catch_up_timeout:g}s")
        rec["catch_up"] = (t_rel, time.time())
    ack = job.stop()
    rec["stop_step"] = ack.applied_at_step
    state = job.wait(timeout=max(30.0, deadline - time.monotonic()))
    if state != hpi.JobState.FINISHED:
        print(f"  warning: job {job.id} ended {state.value}: {job.error} (the logs are "
              "checked all the same)", flush=True)
        rec["ended"] = state.value
    if clients is not None:
        clients.collect(time.monotonic() + 60)
    rec.update(check(a, v, job, clients, calls, t0, t1, rec))
    if setter_job is not None:
        setter_job.close()
    return rec


# ---- checks and figures of one run ----------------------------------------------------------
def check(a: argparse.Namespace, v: str, job: Any, clients: Clients | None,
          calls: list[dict[str, Any]], t0: float, t1: float, rec: dict[str, Any]
          ) -> dict[str, Any]:
    fail: list[str] = list(rec.get("failures", []))
    out: dict[str, Any] = {}
    metrics = history.read_records(job.run_dir.metrics_log)
    events = history.read_records(job.run_dir.events_log)
    train = [r for r in metrics if not r.get("eval")]

    # Throughput over the window, from the job's own log.
    win = [r for r in train if t0 <= float(r["time"]) <= t1]
    if len(win) < 2:
        sys.exit(f"{v}: {len(win)} steps in the window: the job did not train")
    out["window_steps"] = len(win)
    out["job_cpu_ms_per_step"] = 1e3 * rec["job_cpu_s"] / (len(win) - 1)
    out["steps_per_s"] = (len(win) - 1) / (float(win[-1]["time"]) - float(win[0]["time"]))
    out["p50_step_ms"] = 1e3 * median([float(r["step_time"]) for r in win])
    out["p99_step_ms"] = 1e3 * pct([float(r["step_time"]) for r in win], 99)
    if "catch_up" in rec:
        c0, c1 = rec["catch_up"]
        cu = [r for r in train if c0 <= float(r["time"]) <= c1]
        out["catch_up_steps_per_s"] = ((len(cu) - 1) / (float(cu[-1]["time"]) -
                                       float(cu[0]["time"])) if len(cu) > 2 else float("nan"))

    # The metrics log: every step exactly once, in order; seqs unique in both logs.
    steps = [int(r["step"]) for r in train]
    if steps != list(range(len(steps))):
        dup = [s for s, n in Counter(steps).items() if n > 1]
        missing = sorted(set(range(max(steps, default=0) + 1)) - set(steps))
        fail.append(f"metrics log: {len(steps)} step records, not 0..{len(steps) - 1} once "
                    f"each in order (duplicated {dup[:5]}, missing {missing[:5]})")
    seqs = [int(r["seq"]) for r in metrics + events]
    if len(set(seqs)) != len(seqs):
        fail.append(f"logs: {len(seqs) - len(set(seqs))} duplicated seqs")
    for name, recs in (("metrics", metrics), ("events", events)):
        s = [int(r["seq"]) for r in recs]
        if s != sorted(s):
            fail.append(f"{name} log: seqs out of order")
    out["steps_logged"] = len(steps)

    # Acknowledgements, the events log and every rank's record of what it applied.
    if calls:
        expected = round(a.seconds * a.rate)
        acks = [c for c in calls if "id" in c]
        errors = [c for c in calls if "error" in c]
        ids = [c["id"] for c in acks]
        out["sets"] = {"expected": expected, "acked": len(acks), "errors": len(errors),
                       "distinct_ids": len(set(ids))}
        if len(acks) != expected or errors or len(set(ids)) != len(ids):
            fail.append(f"set(): {len(acks)} acks of {expected} expected, {len(errors)} "
                        f"errors (e.g. {errors[0]['error'] if errors else '-'}), "
                        f"{len(ids) - len(set(ids))} duplicate ids")
        changes = [e for e in events if e.get("kind") == "change" and e.get("source") == SOURCE]
        applied: dict[str, list[dict[str, Any]]] = {}
        for e in changes:
            if e.get("status") == "applied":
                applied.setdefault(str(e["id"]), []).append(e)
        other = Counter(str(e.get("status")) for e in changes if e.get("status") != "applied")
        bad = [c["id"] for c in acks
               if len(applied.get(c["id"], [])) != 1
               or applied[c["id"]][0].get("applied_at_step") != c["step"]
               or applied[c["id"]][0].get("values") != c["values"]]
        extra = set(applied) - set(ids)
        out["events"] = {"applied": sum(len(x) for x in applied.values()), **dict(other)}
        if bad or extra or other:
            fail.append(f"events log: {len(bad)} acks without exactly one matching applied "
                        f"change event (e.g. {bad[:3]}), {len(extra)} applied events without "
                        f"an ack, other statuses {dict(other)}")
        ranks = history.rank_applies(job.run_dir)
        by_rank = {r: {row["id"]: row["step"] for row in rows} for r, rows in ranks.items()}
        off = [(c["id"], r) for c in acks for r in range(a.nproc)
               if by_rank.get(r, {}).get(c["id"]) != c["step"]]
        if off:
            fail.append(f"ranks: {len(off)} (ack, rank) pairs where the rank did not apply "
                        f"the change at the ack's step (e.g. {off[:3]})")
        lat = [1e3 * (c["end"] - c["start"]) for c in acks]
        late = [1e3 * (c["start"] - c["due"]) for c in calls]
        starts = sorted(c["start"] for c in calls)
        per_boundary = list(Counter(c["step"] for c in acks).values())
        out["setter"] = {
            "rate": (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else 0.0,
            "lat_p50_ms": median(lat), "lat_p99_ms": pct(lat, 99),
            "lat_max_ms": max(lat, default=float("nan")),
            "start_late_p99_ms": pct(late, 99), "start_late_max_ms": max(late),
            "boundaries": len(per_boundary), "per_boundary_mean": sum(per_boundary) /
            max(1, len(per_boundary)), "per_boundary_max": max(per_boundary, default=0)}

    # Every client got every record of the logs once, in order, with the same content.
    if clients is not None:
        log = sorted(metrics + events, key=lambda r: int(r["seq"]))
        log_seqs = [int(r["seq"]) for r in log]
        want = summary_of(log, [0.0] * len(log))["digest"]
        lags: list[list[float]] = []
        out["clients"] = {}
        for i, kind in enumerate(clients.kinds):
            res = clients.results.get(i)
            if res is None or "error" in res:
                fail.append(f"client {i} ({kind}): "
                            f"{'no result' if res is None else res['error'][-800:]}")
                continue
            if kind == "burn":
                continue
            got = res["seqs"]
            if got != log_seqs:
                dup = len(got) - len(set(got))
                miss = sorted(set(log_seqs) - set(got))
                order = got != sorted(got)
                fail.append(f"client {i} ({kind}): {len(got)} records, the logs have "
                            f"{len(log_seqs)}: {len(miss)} missing (e.g. {miss[:5]}), "
                            f"{dup} duplicated, {'out of order' if order else 'in order'}")
            elif res["digest"] != want:
                fail.append(f"client {i} ({kind}): the same seqs as the logs but other content")
            if kind == "stream":
                lags.append([1e3 * (arr - t) for t, arr in res["times"] if t0 <= t <= t1])
            out["clients"].setdefault(kind, []).append(
                {"records": len(got), "cpu_s": res["cpu_s"],
                 **{k: res[k] for k in ("slow", "stuck") if k in res}})
        if lags:
            out["lag_p50_ms"] = median([median(x) for x in lags])
            out["lag_p99_ms"] = max(pct(x, 99) for x in lags)
            out["lag_max_ms"] = max(max(x, default=0.0) for x in lags)
    out["failures"] = fail
    return out


# ---- driver --------------------------------------------------------------------------------
def line(r: int, v: str, rec: dict[str, Any], took: float) -> str:
    s = (f"round {r}  {v:<6} {rec['steps_per_s']:7.1f} steps/s  p50 step "
         f"{rec['p50_step_ms']:.2f} ms  ({rec['window_steps']} steps in window; load avg "
         f"{rec['load_avg']:.2f}; run took {took:.0f} s)")
    if "sets" in rec:
        st = rec["setter"]
        s += (f"\n           sets {rec['sets']['acked']}/{rec['sets']['expected']} acked at "
              f"{st['rate']:.1f}/s, latency p50 {st['lat_p50_ms']:.0f} / p99 "
              f"{st['lat_p99_ms']:.0f} ms, {st['boundaries']} boundaries "
              f"({st['per_boundary_mean']:.1f} per boundary, max {st['per_boundary_max']}); "
              f"stream delay p50 "
              f"{rec.get('lag_p50_ms', float('nan')):.0f} / p99 "
              f"{rec.get('lag_p99_ms', float('nan')):.0f} ms")
    for c in rec.get("clients", {}).get("stuck", []):
        st = c["stuck"]
        gap = (f"then a gap {st['first_gap'][0]} -> {st['first_gap'][1]}: the PUB dropped "
               "for it" if st["first_gap"] else "and no gap: the PUB had dropped nothing yet")
        s += (f"\n           stuck: its socket held {st['held_messages']} messages from seq "
              f"{st['held_first_seq']} {gap}")
    for c in rec.get("clients", {}).get("slow", []):
        sl = c["slow"]
        s += (f"\n           slow: {sl['live_messages_records']} records read live, "
              f"{sl['live_gaps']} gaps in them (PUB drops), {sl['from_history']} records from "
              "the history")
    if "catch_up" in rec:
        took = rec["catch_up"][1] - rec["catch_up"][0]
        s += (f"\n           after the window both caught up in {took:.1f}"
              f" s (the job meanwhile: {rec['catch_up_steps_per_s']:.0f} steps/s, no sets)")
    cores = rec["cpu_cores"]
    s += ("\n           CPU cores in use over the window: job {job:.2f}, clients {clients:.2f}, "
          "driver {driver:.2f}, the rest {others:.2f} (machine {machine:.2f} of 2; stolen by "
          "the hypervisor {steal:.2f})").format(**cores)
    s += f"; job CPU {rec['job_cpu_ms_per_step']:.1f} ms/step"
    for f in rec["failures"]:
        s += f"\n           CHECK FAILED: {f}"
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="the window under load")
    ap.add_argument("--rate", type=float, default=100.0, help="set() calls a second")
    ap.add_argument("--subscribers", type=int, default=16)
    ap.add_argument("--clients", choices=("processes", "threads"), default="processes",
                    help="where the subscribers run (the slow and stuck ones: processes)")
    ap.add_argument("--rounds", type=int, default=2, help="an even number balances the order")
    ap.add_argument("--variants", default="idle,load,stuck,shared",
                    help=f"comma-separated, from {', '.join(VARIANTS)}; the first is the base")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=300, help="steps before the window")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds before the window")
    ap.add_argument("--slow-ms", type=float, default=200.0,
                    help="the slow subscriber's sleep before each read of its socket")
    ap.add_argument("--slow-hwm", type=int, default=4, help="its socket's RCVHWM")
    ap.add_argument("--setter-threads", type=int, default=64)
    ap.add_argument("--burn-cores", type=float, default=0.2,
                    help="the burn variant's CPU, all its processes together")
    ap.add_argument("--burn-hz", type=float, default=40.0,
                    help="the burn variant's wake-ups a second, per process")
    ap.add_argument("--client-priority", choices=("idle", "normal"), default="idle",
                    help="the clients' and the setter's CPU priority (not the job's); the "
                         "shared variant runs them at normal")
    ap.add_argument("--catch-up-timeout", type=float, default=60.0)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    a = ap.parse_args()
    variants = a.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        ap.error(f"unknown variants: {', '.join(sorted(unknown))}")
    home = private_home(a.keep)
    OUT.mkdir(exist_ok=True)
    started = time.monotonic()
    print(machine_facts())
    print(f"load: {a.nproc} ranks, gloo/CPU; {a.subscribers} subscribers ({a.clients}) and "
          f"{a.rate:g} set()/s for {a.seconds:g} s; {a.rounds} rounds of "
          f"{' / '.join(variants)}, order flipped each round (HPINTERACT_HOME={home})\n"
          "This machine is shared and noisy (others' tests run on it): read the ratios, "
          "their min and max, and the CPU figures, not absolute speeds.\n", flush=True)

    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(a.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            t = time.monotonic()
            rec = run_once(a, v, home)
            results[v].append(rec)
            print(line(r, v, rec, time.monotonic() - t), flush=True)
    report(a, variants, results, time.monotonic() - started)


def report(a: argparse.Namespace, variants: list[str],
           results: dict[str, list[dict[str, Any]]], took: float) -> None:
    first, others = variants[0], variants[1:]

    def base_of(v: str) -> str:  # "load-thread" against "idle-thread", if run
        idle = "idle" + v[len(kind_of(v)):]
        return idle if idle != v and idle in variants else first

    tput = {v: round_ratios(results, base_of(v), v, "steps_per_s") for v in others}
    typical = {v: round_ratios(results, base_of(v), v, "p50_step_ms", invert=True)
               for v in others}
    print(f"\n{'round':<6}" + "".join(f"{v + ' steps/s':>16}" for v in variants)
          + "".join(f"{v + '/' + base_of(v):>{max(14, len(v + base_of(v)) + 3)}}"
                    for v in others))
    for r in range(a.rounds):
        print(f"{r:<6}" + "".join(f"{results[v][r]['steps_per_s']:>16.1f}" for v in variants)
              + "".join(f"{tput[v][r]:>{max(14, len(v + base_of(v)) + 3)}.4f}"
                        for v in others))
    print(f"\n{'variant':<12}{'steps/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'job CPU':>9}"
          f"{'clients':>9}{'driver':>8}{'rest':>7}{'steal':>7}{'job CPU ms/step':>17}"
          "   (medians over rounds; CPU in cores)")
    for v in variants:
        rs = results[v]

        def med(k: str, rs: list[dict[str, Any]] = rs) -> float:
            return median([x[k] for x in rs])

        def core(k: str, rs: list[dict[str, Any]] = rs) -> float:
            return median([x["cpu_cores"][k] for x in rs])

        print(f"{v:<12}{med('steps_per_s'):>9.1f}{med('p50_step_ms'):>8.2f}"
              f"{med('p99_step_ms'):>8.2f}{core('job'):>9.2f}{core('clients'):>9.2f}"
              f"{core('driver'):>8.2f}{core('others'):>7.2f}{core('steal'):>7.2f}"
              f"{med('job_cpu_ms_per_step'):>17.2f}")
    print("(job CPU: supervisor, torchrun and both ranks, every thread; rest: the machine's "
          "other work, the kernel's included)")
    groups = [g for g in CPU_GROUPS if g != "client"]
    print("\nThe job's CPU ms per step by thread, both ranks, from warm-up to the stop "
          "(train.py --out; medians):\n" f"{'variant':<12}" + "".join(f"{g:>17}" for g in groups))
    for v in variants:
        by = [cpu_groups(x) for x in results[v] if "rank_threads_ms_per_step" in x]
        if by:
            print(f"{v:<12}" + "".join(f"{median([b.get(g, 0.0) for b in by]):>17.3f}"
                                      for g in groups))
    summary: dict[str, Any] = {"args": vars(a), "results": results, "ratios": {},
                               "took_s": took}
    print()
    for v in others:
        t, p, base = tput[v], typical[v], base_of(v)
        summary["ratios"][v] = {"median": median(t), "min": min(t), "max": max(t),
                                "p50_step": median(p)}
        verdict = ("the control, which has no goal" if v == "burn" else
                   f"{'meets' if median(t) >= GOAL else 'MISSES'} the goal >= {GOAL:.2f}")
        cpu = median(round_ratios(results, base, v, "job_cpu_ms_per_step", invert=True))
        summary["ratios"][v]["job_cpu"] = cpu
        print(f"throughput {v}/{base}: median {median(t):.4f} (min {min(t):.4f}, max "
              f"{max(t):.4f}, {len(t)} rounds): {verdict}\n"
              f"    typical-step ratio ({base} p50 / {v} p50) {median(p):.4f}; job CPU-cost "
              f"ratio ({base} / {v} CPU ms per step) {cpu:.4f}")
    if "load" in variants and "burn" in variants:
        lb = round_ratios(results, "burn", "load", "steps_per_s")
        summary["ratios"]["load/burn"] = {"median": median(lb), "min": min(lb), "max": max(lb)}
        print(f"throughput load/burn (the load against other work of about its CPU on the "
              f"same cores): median {median(lb):.4f} (min {min(lb):.4f}, max {max(lb):.4f})")
    if "load" in variants and "stuck" in variants:
        sl = round_ratios(results, "load", "stuck", "steps_per_s")
        summary["ratios"]["stuck/load"] = {"median": median(sl), "min": min(sl), "max": max(sl)}
        print(f"throughput stuck/load (the stuck and slow subscribers alone): median "
              f"{median(sl):.4f} (min {min(sl):.4f}, max {max(sl):.4f})")
    failures = [f"{v} round {r}: {f}" for v in variants for r, x in enumerate(results[v])
                for f in x["failures"]]
    summary["failures"] = failures
    (OUT / "load.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{machine_facts()}\nwhole run: {took:.0f} s; raw numbers in {OUT / 'load.json'}")
    if failures:
        print(f"\n{len(failures)} CHECK(S) FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("checks: every set() acknowledged and applied once on every rank at its step, the "
          "logs complete, every subscriber got every record once in order: passed")


if __name__ == "__main__":
    main()
