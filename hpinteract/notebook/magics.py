"""``%hp``: the job API as IPython line magics (``%load_ext hpinteract``).

Runs in: the notebook kernel (any IPython shell). Each subcommand is parsed by IPython's
magic_arguments, so misuse raises ``UsageError`` with the subcommand's usage; values in
``k=v`` are parsed as numbers, booleans or strings (client.values), never evaluated. The
last job launched or attached is the current one; the others are named by id.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, real_name

from ..client import Job, attach, jobs, launch
from ..client.values import parse_assignments
from ..policies.base import Policy
from ..protocol.errors import HpiError

SUBCOMMANDS = ("launch", "attach", "set", "get", "status", "pause", "resume", "stop",
               "checkpoint", "resize", "dashboard", "jobs", "policy")


def _parse(magic: Any, rest: str) -> Any:
    """Shell-like splitting (quotes group words and are removed, unlike IPython's
    arg_split), then the subcommand's argparse parser, which raises UsageError."""
    try:
        argv = shlex.split(rest)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"{real_name(magic)}: {exc}") from None
    return magic.parser.parse_args(argv)


@magics_class
class HpMagics(Magics):
    """``%hp SUBCOMMAND ...``; ``%hp`` alone lists the subcommands."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.job: Job | None = None

    @line_magic
    def hp(self, line: str) -> Any:
        """Control hpinteract jobs: %hp launch|attach|set|get|status|pause|resume|stop|
        checkpoint|resize|dashboard|jobs|policy ... (``%hp SUBCOMMAND -h`` for each one's
        options)."""
        sub, _, rest = line.strip().partition(" ")
        if sub not in SUBCOMMANDS:
            what = f"unknown subcommand {sub!r}" if sub else "a subcommand is needed"
            raise UsageError(f"%hp: {what}; use one of: {', '.join(SUBCOMMANDS)}")
        try:
            return getattr(self, f"_{sub}")(rest)
        except HpiError as exc:  # the job refused: its message, not a traceback
            raise UsageError(f"%hp {sub}: {exc}") from None

    @property
    def user_ns(self) -> dict[str, Any]:
        return self.shell.user_ns if self.shell is not None else {}

    def current(self) -> Job:
        if self.job is None:
            raise UsageError("%hp: no current job; start one with %hp launch SCRIPT_OR_"
                             "FUNCTION or pick one with %hp attach ID|latest")
        return self.job

    @magic_arguments(name="%hp launch")
    @argument("target", help="a training script (path), or a function train(run) defined "
                             "in this notebook")
    @argument("--nproc", type=int, default=1, help="ranks (default 1)")
    @argument("--set", nargs="+", default=[], metavar="K=V",
              help="hyper-parameter values to start with")
    @argument("--backend", choices=("gloo", "nccl"), default=None)
    @argument("--max-restarts", type=int, default=0, metavar="N",
              help="restart the workers from the newest checkpoint when a rank dies")
    def _launch(self, rest: str) -> Job:
        """%hp launch SCRIPT_OR_FUNCTION [--nproc N] [--set k=v ...] [-- script args]"""
        own, sep, script_args = rest.partition(" -- ")
        args = _parse(self._launch, own)
        hparams = parse_assignments(args.set)
        target: Any = args.target
        fn = self.user_ns.get(target) if target.isidentifier() else None
        if callable(fn):
            if sep:
                raise UsageError("%hp launch: script arguments (after --) are for scripts; "
                                 f"{target} is a function")
            target = fn
        elif not Path(target).expanduser().is_file():
            raise UsageError(f"%hp launch: {target!r} is neither a file nor a function "
                             "defined in this notebook")
        self.job = launch(target, nproc=args.nproc, hparams=hparams, backend=args.backend,
                          args=shlex.split(script_args) if sep else (),
                          max_restarts=args.max_restarts)
        return self.job

    @magic_arguments(name="%hp attach")
    @argument("job", nargs="?", default="latest", help="a job id, a unique prefix, or latest")
    def _attach(self, rest: str) -> Job:
        """%hp attach [ID|latest]"""
        args = _parse(self._attach, rest)
        self.job = attach(args.job)
        return self.job

    @magic_arguments(name="%hp set")
    @argument("values", nargs="+", metavar="K=V")
    @argument("--reason", default=None, help="written to the change log with the change")
    def _set(self, rest: str) -> Any:
        """%hp set k=v [k=v ...] [--reason TEXT]"""
        args = _parse(self._set, rest)
        return self.current().set(parse_assignments(args.values), source="magic",
                                  reason=args.reason)

    def _no_args(self, sub: str, rest: str) -> None:
        if rest.strip():
            raise UsageError(f"%hp {sub} takes no arguments, got {rest.strip()!r}")

    def _get(self, rest: str) -> dict[str, Any]:
        """%hp get: the effective hyper-parameters."""
        self._no_args("get", rest)
        return self.current().get()

    def _status(self, rest: str) -> dict[str, Any]:
        self._no_args("status", rest)
        return self.current().status()

    def _pause(self, rest: str) -> Any:
        self._no_args("pause", rest)
        return self.current().pause(source="magic")

    def _resume(self, rest: str) -> Any:
        self._no_args("resume", rest)
        return self.current().resume(source="magic")

    def _stop(self, rest: str) -> Any:
        self._no_args("stop", rest)
        return self.current().stop(source="magic")

    def _checkpoint(self, rest: str) -> Any:
        self._no_args("checkpoint", rest)
        return self.current().checkpoint(source="magic")

    @magic_arguments(name="%hp resize")
    @argument("workers", type=int, help="the number of ranks from the next step on")
    @argument("--no-wait", action="store_true", help="return at the step boundary")
    def _resize(self, rest: str) -> Any:
        """%hp resize N [--no-wait]: checkpoint, and go on with N ranks"""
        args = _parse(self._resize, rest)
        return self.current().resize(args.workers, wait=not args.no_wait, source="magic")

    def _dashboard(self, rest: str) -> Any:
        self._no_args("dashboard", rest)
        return self.current().dashboard()

    def _jobs(self, rest: str) -> Any:
        self._no_args("jobs", rest)
        import pandas as pd

        return pd.DataFrame([j._asdict() for j in jobs()],
                            columns=["id", "state", "script", "nproc", "step", "created"])

    @magic_arguments(name="%hp policy")
    @argument("action", choices=("add", "list", "remove", "enable"))
    @argument("name", nargs="?", help="a built-in (adaptive_batch, warmup, ...) or a Policy "
                                      "or function defined in this notebook")
    @argument("params", nargs="*", metavar="K=V", help="a built-in's parameters")
    @argument("--every", type=int, default=1, help="run every N steps (default 1)")
    def _policy(self, rest: str) -> Any:
        """%hp policy add NAME [k=v ...] [--every N] | list | remove NAME | enable NAME"""
        args = _parse(self._policy, rest)
        job = self.current()
        if args.action == "list":
            import pandas as pd

            return pd.DataFrame(job.policies())
        if not args.name:
            raise UsageError(f"%hp policy {args.action} needs a policy name")
        if args.action == "remove":
            job.remove_policy(args.name)
            return None
        if args.action == "enable":
            job.enable_policy(args.name)
            return None
        params = parse_assignments(args.params)
        local = self.user_ns.get(args.name) if args.name.isidentifier() else None
        if isinstance(local, Policy) or callable(local):
            if params:
                raise UsageError("%hp policy add: k=v parameters are for built-ins; configure "
                                 f"{args.name} in Python instead")
            return job.add_policy(local, every=args.every, name=args.name)
        return job.add_policy(args.name, every=args.every, **params)


def load(ipython: Any) -> None:
    ipython.register_magics(HpMagics)
