"""The ``hpinteract`` command: launch, find, tune and watch jobs from a shell.

Runs in: the user's terminal process. It is one more client of the ``Job`` API, like a
notebook: it never imports torch, and the job owns all state, so ``hpinteract watch`` can be
interrupted and restarted at any time without losing anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from . import __version__
from .client import Job, attach, jobs, launch
from .client.values import parse_assignments
from .protocol.errors import ConfigError, HpiError, InvalidCommand, InvalidHParam, JobNotFound
from .protocol.rundir import home
from .protocol.states import JobState

# Errors in what the command line named (a value, a job id) exit 2, like argparse's own.
USAGE_ERRORS = (InvalidHParam, InvalidCommand, JobNotFound, ConfigError)
LINES_PER_S = 2.0  # `watch` into a pipe or file: a log, not a flood
REDRAWS_PER_S = 10.0  # `watch` on a terminal: smooth, yet cheap over a slow ssh link
SHOWN = (("step", "step"), ("epoch", "epoch"), ("loss", "loss"), ("lr", "lr"),
         ("batch_size", "batch"), ("samples_per_s", "samples/s"))


# ---- formatting ---------------------------------------------------------------------------
def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def wire(value: Any) -> str:
    """A value as `set` reads it back (strings quoted, booleans lower-case)."""
    return json.dumps(value)


def progress_bar(rec: dict[str, Any], width: int = 24) -> str:
    """The ``progress`` metric (0..1) as a bar; without one, the step count."""
    p = rec.get("progress")
    if isinstance(p, int | float) and not isinstance(p, bool):
        p = min(1.0, max(0.0, float(p)))
        n = round(p * width)
        return f"[{'#' * n}{'.' * (width - n)}] {p:6.1%}"
    return f"[step {rec.get('step', '?')}]"


def metric_line(rec: dict[str, Any]) -> str:
    parts = [progress_bar(rec)]
    parts += [f"{label} {fmt(rec[key])}" for key, label in SHOWN if rec.get(key) is not None]
    return "  ".join(parts)


def event_line(rec: dict[str, Any]) -> str:
    kind, src = rec.get("kind"), rec.get("source") or "?"
    if kind == "change":
        raw = rec.get("values")
        vals = " ".join(f"{k}={fmt(v)}" for k, v in raw.items()) if isinstance(raw, dict) \
            else str(raw)
        if rec.get("status") == "applied":
            return f"* set {vals} at step {rec.get('applied_at_step')} (from {src})"
        return f"* set {vals} {rec.get('status')} (from {src}): {rec.get('error')}"
    if kind == "state":
        at = f" at step {rec['step']}" if rec.get("step") is not None else ""
        return f"* {rec.get('state')}{at} (from {src})"
    rest = " ".join(f"{k}={v}" for k, v in rec.items() if k not in ("seq", "time", "kind"))
    return f"* {kind}: {rest}"


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


# ---- watch --------------------------------------------------------------------------------
class Display:
    """The latest metrics, redrawn in place on a terminal or throttled lines elsewhere;
    events are printed whole, above the progress line."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out, self.tty = out, tty
        self.line = ""  # the latest metric line
        self.dirty = False  # ...not yet written
        self.shown = 0  # width of the line drawn in place (terminal only)
        self.last = -1e9
        self.interval = 1.0 / (REDRAWS_PER_S if tty else LINES_PER_S)

    def metric(self, rec: dict[str, Any]) -> None:
        self.line, self.dirty = metric_line(rec), True
        if time.monotonic() - self.last >= self.interval:
            self.flush()

    def flush(self) -> None:
        if not self.dirty:
            return
        self.dirty, self.last = False, time.monotonic()
        if self.tty:
            # Never wider than the terminal: a wrapped line cannot be redrawn with \r.
            line = self.line[: max(10, shutil.get_terminal_size().columns - 1)]
            self.out.write("\r" + line.ljust(self.shown))
            self.shown = len(line)
        else:
            self.out.write(self.line + "\n")
        self.out.flush()

    def message(self, text: str) -> None:
        if self.tty:
            if self.shown:
                self.out.write("\r" + " " * self.shown + "\r")
                self.shown = 0
            self.out.write(text + "\n")
            self.dirty = bool(self.line)
        else:
            self.flush()  # the step it happened after comes first
            self.out.write(text + "\n")
        self.flush()

    def close(self) -> None:
        self.flush()
        if self.tty and self.shown:
            self.out.write("\n")
            self.shown = 0
        self.out.flush()


def watch(job: Job, out: TextIO | None = None) -> int:
    """Follow a job until it ends: 0 if it finished, 1 if it failed, 130 on Ctrl-C."""
    out = out or sys.stdout
    display = Display(out, out.isatty())
    try:
        for rec in job.stream():
            if "kind" in rec:
                display.message(event_line(rec))
            elif "step" in rec:
                display.metric(rec)
    except KeyboardInterrupt:
        display.close()
        print(f"stopped watching; job {job.id} keeps running", file=sys.stderr)
        return 130
    display.close()
    return report_end(job, job.wait(), out)


def report_end(job: Job, state: JobState, out: TextIO) -> int:
    step = job.status().get("step")
    print(f"job {job.id} {state.value}" + (f" after {step} steps" if step else ""), file=out)
    if state == JobState.FAILED:
        print(f"error: {job.error}", file=sys.stderr)
        return 1
    return 0


# ---- commands -----------------------------------------------------------------------------
def cmd_run(a: argparse.Namespace) -> int:
    hparams = parse_assignments(a.set)
    try:
        job = launch(a.script, nproc=a.nproc, hparams=hparams, args=a.script_args,
                     backend=a.backend)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(job.id, flush=True)
    return watch(job) if a.watch else 0


def cmd_jobs(a: argparse.Namespace) -> int:
    found = jobs()
    if not found:
        print(f"no jobs under {home() / 'jobs'}")
        return 0
    rows = [("ID", "STATE", "STEP", "NPROC", "SCRIPT")]
    rows += [(j.id, j.state, "-" if j.step is None else str(j.step),
              "-" if j.nproc is None else str(j.nproc), j.script) for j in found]
    print(table(rows))
    return 0


def cmd_set(a: argparse.Namespace) -> int:
    values = parse_assignments(a.assignments)  # before attaching: bad input fails fast
    ack = attach(a.job).set(values, source="cli")
    vals = " ".join(f"{k}={wire(v)}" for k, v in ack.values.items())
    print(f"applied at step {ack.applied_at_step}: {vals} (change {ack.change_id})")
    return 0


def cmd_get(a: argparse.Namespace) -> int:
    hparams = attach(a.job).get()
    if a.json:
        print(json.dumps(hparams, indent=1, sort_keys=True))
    else:
        width = max((len(n) for n in hparams), default=0)
        for name in sorted(hparams):
            print(f"{name.ljust(width)} = {wire(hparams[name])}")
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    job = attach(a.job)
    st = job.status()
    if a.json:
        print(json.dumps({k: v for k, v in st.items() if k != "ok"}, indent=1, default=str))
        return 0
    ranks = st.get("world_size") or job.spec.get("nproc")
    print(f"job {job.id}: {st.get('state')}" + (f" ({ranks} ranks)" if ranks else ""))
    print(f"step {st.get('step', 0)}  epoch {st.get('epoch', 0)}"
          + (f" of {st['epochs']}" if st.get("epochs") else ""))
    hp = st.get("hparams") or {}
    print("hparams: " + " ".join(f"{k}={wire(hp[k])}" for k in sorted(hp)))
    if st.get("latest"):
        print("latest:  " + metric_line(st["latest"]))
    if st.get("state") == JobState.FAILED.value:
        print(f"error: {job.error}")
    return 0


def cmd_control(a: argparse.Namespace) -> int:
    job = attach(a.job)
    ack = {"pause": job.pause, "resume": job.resume, "stop": job.stop}[a.command](source="cli")
    done = {"pause": "paused", "resume": "resumed", "stop": "stopping"}[a.command]
    print(f"{done} at step {ack.applied_at_step} (change {ack.change_id})", flush=True)
    if a.command == "stop" and a.wait:
        return report_end(job, job.wait(), sys.stdout)
    return 0


def cmd_watch(a: argparse.Namespace) -> int:
    return watch(attach(a.job))


def cmd_logs(a: argparse.Namespace) -> int:
    job = attach(a.job)
    if not a.follow:
        sys.stdout.write(job.logs(a.rank))
        return 0
    # Job.logs gives whole texts, so following reads the same files from where it left off.
    offsets: dict[str, int] = {}
    try:
        while True:
            ended = job.state.terminal
            paths = [job.run_dir.supervisor_log] if a.rank is None else sorted(
                job.run_dir.logs_dir.glob(f"torchrun/**/attempt_*/{a.rank}/std*.log"))
            for p in paths:
                if p.exists():
                    with open(p, "rb") as f:
                        f.seek(offsets.get(str(p), 0))
                        data = f.read()
                    offsets[str(p)] = offsets.get(str(p), 0) + len(data)
                    sys.stdout.buffer.write(data)
            sys.stdout.flush()
            if ended:
                return 0
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 130


# ---- the command line -----------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpinteract", description="Launch, tune and watch hpinteract training jobs.",
        epilog="Jobs live under $HPINTERACT_HOME (default ~/.local/share/hpinteract).")
    parser.add_argument("--version", action="version", version=f"hpinteract {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], text: str,
            job: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        if job:
            p.add_argument("--job", "-j", default="latest", metavar="ID",
                           help="job id, unique id prefix, run directory or 'latest' (default)")
        p.set_defaults(func=func)
        return p

    p = add("run", cmd_run, "launch SCRIPT under torchrun, detached; prints the job id",
            job=False)
    p.usage = "hpinteract run SCRIPT [options] [-- script args...]"
    p.add_argument("script", metavar="SCRIPT", nargs="?")
    p.add_argument("--nproc", "-n", type=positive_int, default=1, help="ranks (default 1)")
    p.add_argument("--set", "-s", action="extend", nargs="+", default=[], metavar="K=V",
                   help="hyper-parameter overrides")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl with GPUs")
    p.add_argument("--watch", "-w", action="store_true", help="then follow it, like watch")
    add("jobs", cmd_jobs, "list jobs: id, state, step, nproc, script", job=False)
    p = add("set", cmd_set, "change hyper-parameters on every rank at one step")
    p.add_argument("assignments", nargs="+", metavar="K=V")
    for name, func, text in (("get", cmd_get, "print the effective hyper-parameters"),
                             ("status", cmd_status, "print state, step, hparams, metrics")):
        add(name, func, text).add_argument("--json", action="store_true", help="as JSON")
    add("pause", cmd_control, "hold every rank at the same step")
    add("resume", cmd_control, "resume a paused job")
    add("stop", cmd_control, "end training at the same step on every rank").add_argument(
        "--wait", action="store_true", help="then wait for the job to end")
    add("watch", cmd_watch, "follow progress, metrics and changes until the job ends")
    p = add("logs", cmd_logs, "print the job's output (all ranks, or one)")
    p.add_argument("--rank", "-r", type=int, help="only this rank's stdout and stderr")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    return parser


def positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``run``'s own options, and what follows its ``--`` (the script's arguments)."""
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
    if args.command == "run" and args.script is None:
        # `--set k=v ... SCRIPT`: --set took SCRIPT too; assignments always have an '='.
        i = next((i for i, s in enumerate(args.set) if "=" not in s), None)
        if i is None or i < len(args.set) - 1:
            parser.error("run needs one SCRIPT (hyper-parameters are --set K=V ...)")
        args.set, args.script = args.set[:i], args.set[i]
    try:
        return int(args.func(args))
    except HpiError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2 if isinstance(exc, USAGE_ERRORS) else 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hpinteract logs | head`: quiet, as other tools are
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
