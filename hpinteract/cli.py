"""The ``hpinteract`` command: launch, find, tune and watch jobs from a shell.

Runs in: the user's terminal process. It is one more client of the ``Job`` API, like a
notebook: it never imports torch, and the job owns all state, so ``hpinteract watch`` can be
interrupted and restarted at any time without losing anything.
"""

from __future__ import annotations

import json
import os
import sys
import time
from argparse import ArgumentParser, Namespace
from collections.abc import Callable, Sequence
from typing import TextIO

from . import __version__
from .client import Job, attach, jobs, launch
from .client.values import parse_assignments
from .protocol.errors import ConfigError, HpiError, InvalidCommand, InvalidHParam, JobNotFound
from .protocol.rundir import home
from .protocol.states import JobState
from .terminal import assignments, display, eval_line, event_line, metric_line, print_table

# Errors in what the command line named (a value, a job id) exit 2, like argparse's own.
USAGE_ERRORS = (InvalidHParam, InvalidCommand, JobNotFound, ConfigError)


def watch(job: Job, out: TextIO | None = None) -> int:
    """Follow a job until it ends: 0 if it finished, 1 if it failed, 130 on Ctrl-C. On a
    terminal a live progress line, else plain lines (terminal.py)."""
    out = out or sys.stdout
    view = display(out, f"job {job.id}")
    try:
        for rec in job.stream():
            if "kind" in rec:
                view.message(event_line(rec))
            elif rec.get("eval"):
                view.message(eval_line(rec))
            elif "step" in rec:
                view.metric(rec)
    except KeyboardInterrupt:
        view.close()
        print(f"stopped watching; job {job.id} keeps running", file=sys.stderr)
        return 130
    view.close()
    return report_end(job, job.wait(), out)


def report_end(job: Job, state: JobState, out: TextIO) -> int:
    step = job.status().get("step")
    print(f"job {job.id} {state.value}" + (f" after {step} steps" if step else ""), file=out)
    if state == JobState.FAILED:
        print(f"error: {job.error}", file=sys.stderr)
    return int(state == JobState.FAILED)


def cmd_run(a: Namespace) -> int:
    hparams = parse_assignments(a.set)
    try:
        job = launch(a.script, a.nproc, hparams, a.script_args or None, backend=a.backend,
                     max_restarts=a.max_restarts, resume=a.resume, replay=a.replay,
                     job_id=a.job_id, nnodes=a.nnodes, rdzv_endpoint=a.rdzv_endpoint,
                     ip=a.ip)
    except (FileNotFoundError, ValueError) as exc:  # no such script, nproc < 1, bad value
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(job.id, flush=True)
    return watch(job) if a.watch else 0


def cmd_fork(a: Namespace) -> int:
    job = attach(a.job).fork(a.step, parse_assignments(a.set))
    print(job.id, flush=True)
    return 0


def cmd_jobs(a: Namespace) -> int:
    found = jobs()
    if not found:
        print(f"no jobs under {home() / 'jobs'}")
        return 0
    print_table([("ID", "STATE", "STEP", "NPROC", "SCRIPT")] + [
        (j.id, j.state, j.step, j.nproc, j.script) for j in found], sys.stdout, state_col=1)
    return 0


def cmd_set(a: Namespace) -> int:
    values = parse_assignments(a.assignments)  # before attaching: bad input fails fast
    ack = attach(a.job).set(values, source="cli")
    print(f"applied at step {ack.applied_at_step}: {assignments(ack.values)} "
          f"(change {ack.change_id})")
    return 0


def cmd_get(a: Namespace) -> int:
    hparams = attach(a.job).get()
    width = max(map(len, hparams), default=0)
    print(json.dumps(hparams, indent=1, sort_keys=True) if a.json else "\n".join(
        f"{n.ljust(width)} = {json.dumps(hparams[n])}" for n in sorted(hparams)))
    return 0


def cmd_status(a: Namespace) -> int:
    job = attach(a.job)
    st = job.status()
    n = st.get("world_size") or job.spec.get("nproc")
    print(f"job {job.id}: {st.get('state')}" + (f", {n} rank(s)" if n else ""))
    print(f"step {st.get('step', 0)}  epoch {st.get('epoch', 0)} of {st.get('epochs') or '?'}")
    print("hparams: " + assignments(st.get("hparams") or {}))
    if st.get("latest"):
        print("latest:  " + metric_line(st["latest"]))
    if st.get("state") == JobState.FAILED.value:
        print(f"error: {job.error}")
    return 0


def cmd_control(a: Namespace) -> int:
    job = attach(a.job)
    ack = getattr(job, a.command)(source="cli")  # Job.pause, .resume, .stop or .checkpoint
    done = {"pause": "paused", "resume": "resumed", "stop": "stopping",
            "checkpoint": "checkpoint written"}[a.command]
    where = f": {ack.path}" if ack.path else ""
    print(f"{done} at step {ack.applied_at_step} (change {ack.change_id}){where}", flush=True)
    return report_end(job, job.wait(), sys.stdout) if getattr(a, "wait", False) else 0


def cmd_logs(a: Namespace) -> int:
    job = attach(a.job)
    if not a.follow:
        print(text := job.logs(a.rank), end="\n" if text and not text.endswith("\n") else "")
        return 0
    # Job.logs returns whole texts; following reads the same files on from where it was.
    offsets: dict[str, int] = {}
    while True:
        ended = job.state.terminal
        for p in filter(os.path.exists, job.log_paths(a.rank)):
            with open(p, "rb") as f:
                f.seek(offsets.setdefault(str(p), 0))
                sys.stdout.buffer.write(data := f.read())
            offsets[str(p)] += len(data)
        sys.stdout.flush()
        if ended:
            return 0
        time.sleep(0.5)


def cmd_export(a: Namespace) -> int:
    print(attach(a.job).export("tensorboard", a.tensorboard))
    return 0


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="hpinteract", description="Launch, tune and watch hpinteract training jobs.",
        epilog="Jobs live under $HPINTERACT_HOME (default ~/.local/share/hpinteract).")
    parser.add_argument("--version", action="version", version=f"hpinteract {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[..., int], text: str, job: bool = True) -> ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        if job:
            p.add_argument("--job", "-j", default="latest", metavar="ID",
                           help="job id, unique id prefix, run directory or 'latest' (default)")
        p.set_defaults(func=func)
        return p

    p = add("run", cmd_run, "launch SCRIPT under torchrun, detached; prints the job id", False)
    p.usage = "hpinteract run SCRIPT [options] [-- script args...]"
    p.add_argument("script", metavar="SCRIPT", nargs="?")
    p.add_argument("--nproc", "-n", type=int, help="ranks (default 1, or the job's)")
    p.add_argument("--set", "-s", action="extend", nargs="+", default=[], metavar="K=V",
                   help="hyper-parameter overrides")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl with GPUs")
    p.add_argument("--max-restarts", type=int, metavar="N",
                   help="restart the workers from the newest checkpoint when a rank dies")
    p.add_argument("--resume", metavar="ID", help="continue this ended job (SCRIPT optional)")
    p.add_argument("--replay", metavar="ID",
                   help="run this job again with its recorded changes (SCRIPT optional)")
    p.add_argument("--job-id", metavar="ID", help="the new job's id (default: a fresh one)")
    p.add_argument("--nnodes", metavar="N|MIN:MAX",
                   help="this node's part of a job on N nodes (the same call on each); "
                        "MIN:MAX: elastic, a lost node leaves the others going on")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="where the nodes meet (torchrun's c10d rendezvous)")
    p.add_argument("--ip", metavar="ADDR",
                   help="the address rank 0's coordinator binds (default 127.0.0.1)")
    p.add_argument("--watch", "-w", action="store_true", help="then follow it, like watch")
    add("jobs", cmd_jobs, "list jobs: id, state, step, nproc, script", False)
    add("set", cmd_set, "change hyper-parameters on every rank at one step").add_argument(
        "assignments", nargs="+", metavar="K=V")
    add("get", cmd_get, "print the effective hyper-parameters").add_argument(
        "--json", action="store_true", help="as JSON")
    add("status", cmd_status, "print state, step, hyper-parameters, latest metrics")
    add("pause", cmd_control, "hold every rank at the same step")
    add("resume", cmd_control, "resume a paused job")
    add("stop", cmd_control, "end training at the same step on every rank").add_argument(
        "--wait", action="store_true", help="then wait for the job to end")
    add("checkpoint", cmd_control, "save the job's state at the next step boundary")
    p = add("fork", cmd_fork, "start a new job from the job's checkpoint at or before STEP")
    p.add_argument("--step", type=int, required=True, metavar="STEP")
    p.add_argument("--set", "-s", action="extend", nargs="+", default=[], metavar="K=V",
                   help="values on top of those in force at the checkpoint")
    add("watch", lambda a: watch(attach(a.job)), "follow progress and changes until the end")
    add("export", cmd_export, "write the job's metrics and changes for TensorBoard; "
        "prints the directory").add_argument(
        "--tensorboard", required=True, metavar="DIR",
        help="a TensorBoard log directory: the job is written to DIR/<job id>")
    p = add("logs", cmd_logs, "print the job's output (all ranks, or one)")
    p.add_argument("--rank", "-r", type=int, help="only this rank's stdout and stderr")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    return parser


def split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``run``'s own arguments, and what follows its ``--`` (the script's arguments)."""
    command = next((t for t in argv if not t.startswith("-")), None)
    if command != "run" or "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def main(argv: Sequence[str] | None = None) -> int:
    own, script_args = split_script_args(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(own)
    args.script_args = script_args
    if args.command == "run" and args.script is None and not (args.resume or args.replay):
        *args.set, args.script = args.set or [""]  # `--set k=v SCRIPT`: --set took it
        if not args.script or "=" in args.script:
            parser.error("run needs a SCRIPT")
    try:
        return int(args.func(args))
    except HpiError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2 if isinstance(exc, USAGE_ERRORS) else 1
    except KeyboardInterrupt:  # Ctrl-C: the job is not affected, so no traceback
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hpinteract logs | head`: end quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
