"""The ``hpinteract`` command as a user runs it: real CLI processes against one real 2-rank
toy job (shared by the tests, stopped by the watch test), plus fast tests of the parsing and
formatting helpers. Every CLI process gets its own HPINTERACT_HOME, a pytest tmp dir."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import TOY, wait_for_step

import hpinteract as hpi
from hpinteract import cli

REPO = Path(__file__).resolve().parents[1]


def run_cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpinteract.cli", *args], cwd=REPO,
                          env={**os.environ, "HPINTERACT_HOME": str(home)},
                          capture_output=True, text=True, timeout=timeout)


def start_cli(home: Path, *args: str) -> subprocess.Popen[str]:
    # Ctrl-C as in a terminal: a harness that ignores SIGINT (pytest-xdist's workers) would
    # hand the ignoring on, and Python then installs no KeyboardInterrupt.
    return subprocess.Popen([sys.executable, "-m", "hpinteract.cli", *args], cwd=REPO,
                            env={**os.environ, "HPINTERACT_HOME": str(home)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def failed(r: subprocess.CompletedProcess[str], rc: int) -> str:
    """An expected error: the exit status, one `error:` line and no traceback."""
    assert r.returncode == rc, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.stderr.startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    return r.stderr


class Tty:
    """``hpinteract ARGS`` with a pseudo-terminal for its output, as in a terminal or over
    ssh (120 columns); ``finish()`` waits for it and gives what it drew, escapes removed."""

    def __init__(self, home: Path, *args: str) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hpinteract.cli", *args], cwd=REPO, stdin=slave,
            stdout=slave, stderr=slave, close_fds=True,
            env={**os.environ, "HPINTERACT_HOME": str(home), "TERM": "xterm-256color"})
        os.close(slave)
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the other side closed
                return
            if not data:
                return
            self.chunks.append(data)

    def finish(self, timeout: float = 90) -> str:
        assert self.proc.wait(timeout) == 0
        self.reader.join(10)
        os.close(self.master)
        text = b"".join(self.chunks).decode(errors="replace")
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", text)


def end(job: hpi.Job) -> None:
    with contextlib.suppress(hpi.HpiError):  # InvalidState when it has ended already
        job.stop()
    job.wait(60)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli-home")


@pytest.fixture(scope="module")
def job_id(home: Path) -> Iterator[str]:
    jid = ok(run_cli(home, "run", "--nproc", "2", "--set", "sleep=0.01", str(TOY))).strip()
    assert re.fullmatch(r"[\w-]+", jid), jid
    job = hpi.attach(jid, home=home)
    try:
        wait_for_step(job, 1)
        yield jid
    finally:
        end(job)


def hparams(home: Path, jid: str) -> dict[str, object]:
    return dict(json.loads(ok(run_cli(home, "get", "--job", jid, "--json"))))


# ---- against the live job (in file order: the watch test stops it) -------------------------
def test_jobs_with_an_empty_home(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "jobs")
    assert "no jobs" in ok(r) and r.stderr == ""


def test_jobs_lists_the_running_job(home: Path, job_id: str) -> None:
    lines = ok(run_cli(home, "jobs")).splitlines()
    assert lines[0].split() == ["ID", "STATE", "STEP", "NPROC", "SCRIPT"]
    row = next(line.split() for line in lines if line.startswith(job_id))
    assert row[1] == "running" and int(row[2]) >= 1 and row[3] == "2"
    assert row[4].endswith("toy.py")


def test_set_is_applied_and_shown_by_get(home: Path, job_id: str) -> None:
    out = ok(run_cli(home, "set", "lr=0.02"))  # --job defaults to the latest job
    m = re.fullmatch(r"applied at step (\d+): lr=0.02 \(change (\w+)\)\n", out)
    assert m, out
    assert re.search(r"^lr\s+= 0\.02$", ok(run_cli(home, "get", "--job", job_id)), re.M)
    assert hparams(home, job_id)["lr"] == 0.02
    assert "lr=0.02" in ok(run_cli(home, "status", "--job", job_id[:12]))  # a unique prefix
    change = hpi.attach(job_id, home=home).events().query("kind == 'change'").iloc[-1]
    assert (change["id"], change["source"], change["status"]) == (m[2], "cli", "applied")
    assert change["applied_at_step"] == int(m[1])


@pytest.mark.parametrize(("assignment", "expected"), [
    ("lr=abc", "'abc'"),  # the job's own message names the value...
    ("nosuch=1", "'nosuch'"),  # ...and the unknown name
    ("nosuch=1 lr=0.5", "'nosuch'"),  # one bad value: nothing of the change is applied
    ("lr", "expected name=value"),  # rejected by the CLI before it reaches the job
])
def test_invalid_set_exits_2_and_changes_nothing(home: Path, job_id: str, assignment: str,
                                                 expected: str) -> None:
    before = hparams(home, job_id)
    err = failed(run_cli(home, "set", "--job", job_id, *assignment.split()), 2)
    assert expected in err
    assert hparams(home, job_id) == before


def test_pause_status_resume(home: Path, job_id: str) -> None:
    assert re.fullmatch(r"paused at step \d+ \(change \w+\)\n",
                        ok(run_cli(home, "pause", "-j", job_id)))
    assert ": paused, 2 rank(s)" in ok(run_cli(home, "status", "-j", job_id)).splitlines()[0]
    assert ok(run_cli(home, "resume", "-j", job_id)).startswith("resumed at step ")
    assert "cannot resume" in failed(run_cli(home, "resume", "-j", job_id), 1)


def test_checkpoint_prints_the_step_and_the_file(home: Path, job_id: str) -> None:
    out = ok(run_cli(home, "checkpoint", "-j", job_id))
    m = re.fullmatch(r"checkpoint written at step (\d+) \(change \w+\): (\S+)\n", out)
    assert m and Path(m[2]).is_file() and m[2].endswith(f"step-{int(m[1]):09d}.pt"), out


def test_logs_and_unknown_job(home: Path, job_id: str) -> None:
    assert ok(run_cli(home, "logs", "-j", job_id)).strip()  # torchrun's own lines at least
    ok(run_cli(home, "logs", "-j", job_id, "--rank", "0"))
    assert "no job 'nosuchjob'" in failed(run_cli(home, "status", "-j", "nosuchjob"), 2)


def test_export_writes_a_tensorboard_run(home: Path, job_id: str, tmp_path: Path) -> None:
    out = ok(run_cli(home, "export", "-j", job_id, "--tensorboard", str(tmp_path))).strip()
    assert out == str(tmp_path / job_id)
    [events] = Path(out).glob("events.out.tfevents.*")
    assert events.stat().st_size > 0
    assert "required: --tensorboard" in run_cli(home, "export", "-j", job_id).stderr


def test_watch_shows_progress_and_changes_and_ends_after_stop(home: Path, job_id: str) -> None:
    # Ctrl-C leaves a watcher cleanly and the job untouched.
    quitter = start_cli(home, "watch", "--job", job_id)
    assert quitter.stdout is not None and quitter.stdout.readline()
    quitter.send_signal(signal.SIGINT)
    _, err = quitter.communicate(timeout=60)
    assert quitter.returncode == 130 and "keeps running" in err and "Traceback" not in err

    watcher = start_cli(home, "watch", "--job", job_id)
    on_tty = Tty(home, "watch", "--job", job_id)  # as over ssh: a pseudo-terminal
    assert watcher.stdout is not None and watcher.stdout.readline()  # it is following
    step = int(re.findall(r"\d+", ok(run_cli(home, "set", "-j", job_id, "lr=0.03")))[0])
    assert ok(run_cli(home, "stop", "-j", job_id)).startswith("stopping at step ")
    out, err = watcher.communicate(timeout=90)
    assert watcher.returncode == 0, err
    assert "\r" not in out and "\x1b" not in out  # not a terminal: plain lines
    assert re.search(r"^step \d+  \d+\.\d%  \S+ steps/s  epoch \d+  loss \S+  lr ", out, re.M)
    assert f"* set lr=0.03 at step {step} (from cli)" in out
    assert re.search(r"^\* stopping at step \d+ \(from cli\)$", out, re.M)
    assert re.fullmatch(rf"job {job_id} finished after \d+ steps", out.splitlines()[-1])
    assert hpi.attach(job_id, home=home).state == hpi.JobState.FINISHED
    # On the terminal: rich's live bar with percentage, rate and ETA; the same events
    # printed above it, and the same end.
    shown = on_tty.finish()
    assert "━" in shown and re.search(r"\d+% +\S+ steps/s +ETA \d+:\d\d:\d\d", shown)
    assert f"* set lr=0.03 at step {step} (from cli)" in shown
    assert f"job {job_id} finished after" in shown


def test_run_watch_of_a_failing_job_exits_1(home: Path, job_id: str) -> None:
    end(hpi.attach(job_id, home=home))  # one training job at a time
    r = run_cli(home, "run", "--watch", str(TOY), "--", "--crash-rank", "0", "--crash-step",
                "3", "--n", "32")
    err = failed(r, 1)
    assert "boom on purpose at step 3" in err
    lines = r.stdout.splitlines()
    crashed = lines[0]
    assert re.fullmatch(rf"job {crashed} failed after \d+ steps", lines[-1])
    # watching it again afterwards replays its history and reports the same end
    again = run_cli(home, "watch", "--job", crashed)
    assert "boom on purpose" in failed(again, 1) and again.stdout.splitlines()[-1] == lines[-1]
    table = ok(run_cli(home, "jobs"))
    assert re.search(rf"^{job_id}\s+finished\s", table, re.M)
    assert re.search(rf"^{crashed}\s+failed\s+\S+\s+1\s", table, re.M)


# ---- fast: parsing and formatting, in process ------------------------------------------------
def test_script_args_follow_run_double_dash() -> None:
    argv = ["run", "t.py", "-n", "2", "--", "--epochs", "3", "--", "x"]
    assert cli.split_script_args(argv) == (["run", "t.py", "-n", "2"],
                                           ["--epochs", "3", "--", "x"])
    assert cli.split_script_args(["set", "--", "lr=1"]) == (["set", "--", "lr=1"], [])
    a = cli.build_parser().parse_args(["run", "t.py", "--set", "a=1", "b=x", "-s", "c=2"])
    assert (a.script, a.set, a.nproc, a.job if "job" in a else None) == (
        "t.py", ["a=1", "b=x", "c=2"], None, None)  # nproc: 1, or a resumed job's own
    assert cli.build_parser().parse_args(["watch"]).job == "latest"
    a = cli.build_parser().parse_args(["fork", "-j", "abc", "--step", "120", "-s", "lr=0.1"])
    assert (a.job, a.step, a.set) == ("abc", 120, ["lr=0.1"])


def test_cli_errors_in_process(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPINTERACT_HOME", str(tmp_path))
    # `--set k=v SCRIPT`: the script is found after the assignments (then it does not exist)
    assert cli.main(["run", "--set", "lr=0.1", str(tmp_path / "nope.py")]) == 2
    assert "no training script" in capsys.readouterr().err
    assert cli.main(["set", "lr"]) == 2
    assert capsys.readouterr().err == "error: expected name=value, got 'lr'\n"
    assert cli.main(["status"]) == 2
    assert capsys.readouterr().err.startswith("error: no jobs under ")
    # --resume and --replay need no SCRIPT (the job's own), but a job that exists
    assert cli.main(["run", "--replay", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert cli.main(["fork", "--step", "5"]) == 2
    assert capsys.readouterr().err.startswith("error: no jobs under ")
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--nproc", "two", "t.py"])
    assert exc.value.code == 2
    script = tmp_path / "t.py"
    script.write_text("")
    assert cli.main(["run", str(script), "--nnodes", "2", "--job-id", "x"]) == 2
    assert "needs rdzv_endpoint='host:port'" in capsys.readouterr().err
    assert cli.main(["run", str(script), "--nnodes", "2", "--rdzv-endpoint", "h:1"]) == 2
    assert "needs job_id" in capsys.readouterr().err
