"""The terminal views in process: rich's live line on a (pretend) terminal, plain lines into
a pipe, rate and ETA on the job's clock. The real ``hpinteract watch`` on a pseudo-terminal
and into a pipe is in tests/test_cli.py."""

from __future__ import annotations

import io
import re

from hpinteract import terminal


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def rec(step: int, t: float, **more: object) -> dict[str, object]:
    return {"step": step, "time": t, **more}


def test_metric_and_event_lines() -> None:
    r = rec(3, 0.0, epoch=1, progress=0.5, loss=0.25, lr=0.01, batch_size=64,
            samples_per_s=12345.6)
    assert terminal.metric_line(r) == ("step 3  50.0%  epoch 1  loss 0.25  lr 0.01  "
                                       "batch 64  samples/s 12346")
    assert terminal.metric_line({"step": 7, "loss": 1.0}, "2 steps/s") == \
        "step 7  2 steps/s  loss 1"
    assert terminal.event_line({"kind": "change", "values": {"lr": 0.1}, "status": "applied",
                                "applied_at_step": 9, "source": "cli"}) == \
        "* set lr=0.1 at step 9 (from cli)"
    assert terminal.event_line({"kind": "change", "values": {"lr": 0.1}, "status": "applied",
                                "applied_at_step": 9, "source": "policy:plateau",
                                "reason": "loss flat"}) == \
        "* set lr=0.1 at step 9 (from policy:plateau): loss flat"
    assert terminal.event_line({"kind": "change", "values": {"lr": "x"}, "status": "rejected",
                                "source": "api", "error": "lr must be float"}) == \
        '* set lr="x" rejected (from api): lr must be float'
    assert terminal.event_line({"kind": "state", "state": "paused", "step": 4,
                                "source": "cli"}) == "* paused at step 4 (from cli)"
    assert terminal.table([("A", "BB"), ("xyz", None)]) == "A    BB\nxyz  -"
    assert terminal.eval_line({"seq": 4, "time": 1.0, "step": 30, "epoch": 2, "eval": True,
                               "val_loss": 0.25, "val_acc": 0.875}) == \
        "* eval at step 30: val_loss 0.25  val_acc 0.875"


def test_rate_and_eta_follow_the_jobs_clock() -> None:
    pace = terminal.Pace()
    assert pace.rate() == "" and pace.eta() == "ETA -:--:--"
    for i in range(11):  # 5 steps a second, 1 % of the job a second
        pace.add(rec(5 * i, 100.0 + i, progress=0.01 * i))
    assert pace.rate() == "5 steps/s"
    assert pace.eta() == "ETA 0:01:30"  # 90 % left at 1 % a second
    for i in range(11, 60):  # only the last RATE_WINDOW_S count: now 10 steps a second
        pace.add(rec(5 * 11 + 10 * (i - 11), 100.0 + i, progress=0.1 + 0.001 * i))
    assert pace.rate() == "10 steps/s"
    pace.add(rec(3, 200.0))  # the job went back to step 3 (a restart): measured afresh
    assert pace.rate() == "" and pace.eta() == "ETA -:--:--"


def test_plain_lines_into_a_pipe() -> None:
    out = io.StringIO()
    d = terminal.display(out)
    assert isinstance(d, terminal.Lines)
    for step in range(50):
        d.metric(rec(step, step / 10))
        if step == 20:
            d.message("* paused at step 20 (from cli)")
    d.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert lines[0] == "step 0" and lines[-1] == "step 49  10 steps/s"
    # the event follows the step it came at; throttled: not a line a step
    assert lines[lines.index("* paused at step 20 (from cli)") - 1] == "step 20  10 steps/s"
    assert len(lines) < 10


def test_rich_live_line_on_a_terminal() -> None:
    out = Tty()
    d = terminal.display(out, "job x")
    assert isinstance(d, terminal.Live)
    d.progress.console.width = 120  # the pretend terminal's
    for step in range(0, 101, 10):
        d.metric(rec(step, step / 20, progress=step / 200, loss=1.0 / (step + 1), lr=0.1))
    d.message("* set lr=[0.5] at step 100 (from cli)")  # brackets: not rich markup
    d.close()
    text = out.getvalue()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert "━" in plain  # rich's bar
    assert "50%" in plain and "20 steps/s" in plain and "ETA 0:00:05" in plain
    assert "step 100" in plain and "loss 0.0099" in plain and "lr 0.1" in plain
    assert "* set lr=[0.5] at step 100 (from cli)" in plain
    # the event is printed above the live line, which is drawn last
    assert plain.rindex("* set lr=") < plain.rindex("step 100")


def test_rich_bar_pulses_without_progress() -> None:
    out = Tty()
    d = terminal.display(out)
    d.progress.console.width = 100
    d.metric(rec(7, 1.0, loss=0.5))
    d.close()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "step 7" in plain and "loss 0.5" in plain and "ETA" not in plain


def test_jobs_table_plain_and_rich() -> None:
    rows = [("ID", "STATE", "STEP"), ("a1", "running", 3), ("b2", "failed", None)]
    piped = io.StringIO()
    terminal.print_table(rows, piped, state_col=1)
    assert piped.getvalue() == "ID  STATE    STEP\na1  running  3\nb2  failed   -\n"
    tty = Tty()
    terminal.print_table(rows, tty, state_col=1)
    text = tty.getvalue()
    assert "\x1b[" in text  # coloured states
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert re.search(r"a1\s+running\s+3", plain) and re.search(r"b2\s+failed\s+-", plain)
