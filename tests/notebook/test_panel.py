"""The control panel's widgets, generated from specs, and its handling of the job's answers
(units: a stand-in job and a synchronous worker; test_dashboard.py runs the real thing)."""

from __future__ import annotations

from types import SimpleNamespace

import ipywidgets as w
import pytest

from hpinteract.client import Ack
from hpinteract.notebook.panel import ControlPanel, HParamRow, batch_choices, control_for
from hpinteract.protocol.errors import InvalidHParam
from hpinteract.protocol.hparams import BUILTINS, HParam


@pytest.mark.parametrize(("name", "spec", "value", "kind"), [
    ("lr", BUILTINS["lr"], 0.05, w.FloatLogSlider),
    ("batch_size", BUILTINS["batch_size"], 64, w.Dropdown),
    ("mode", HParam("a", choices=("a", "b")), "a", w.Dropdown),
    ("flag", HParam(True), True, w.Checkbox),
    ("dropout", HParam(0.1, low=0.0, high=0.9), 0.1, w.FloatSlider),
    ("layers", HParam(3, low=1, high=8), 3, w.IntSlider),
    ("workers", HParam(2, low=1, high=64), 2, w.Dropdown),  # a resize: no slider drags
    ("wd", BUILTINS["weight_decay"], 1e-4, w.Text),
    ("note", HParam("hi"), "hi", w.Text),
])
def test_each_spec_gets_its_control(name, spec, value, kind):
    c = control_for(name, spec, value, unit=2)
    assert type(c) is kind
    assert (c.value == str(value)) if kind is w.Text else (c.value == value)
    if kind is w.FloatLogSlider:
        assert 10 ** c.min < value < 10 ** c.max
    if hasattr(c, "continuous_update"):
        assert c.continuous_update is False  # applied on release, not while dragging


def test_the_sizes_offered_for_workers():
    assert control_for("workers", HParam(3, low=1, high=4), 3, unit=3).options == (1, 2, 3, 4)
    assert control_for("workers", HParam(2, low=1, high=64), 2, unit=2).options == (
        1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)


def test_batch_choices_are_the_sizes_the_ranks_can_share():
    assert batch_choices(48, HParam(32, low=1, high=256), unit=16) == [16, 32, 48, 64, 128, 256]
    # Multiples of the 6 ranks only: the powers of two times 6, and the current 60.
    assert batch_choices(60, HParam(60, low=1), unit=6) == [6, 12, 24, 48, 60, 96, 192, 384,
                                                            768, 1536]


def test_a_row_applies_a_user_change_but_not_its_own_updates():
    calls = []
    row = HParamRow("dropout", HParam(0.1, low=0.0, high=0.9), 0.1, 1,
                    lambda n, v: calls.append((n, v)))
    row.control.value = 0.5
    assert calls == [("dropout", 0.5)] and "applying" in row.state.value
    row.applied(0.5, 120, "widget")
    row.show(0.25, 130, "policy:x")  # from elsewhere: shown, not sent back
    assert calls == [("dropout", 0.5)]
    assert row.control.value == 0.25 and "since step 130 (policy:x)" in row.state.value


def test_a_refused_value_is_explained_and_the_control_put_back():
    class Job:
        def set(self, values, source):
            raise InvalidHParam("dropout=0.95 is above the maximum 0.9", field="dropout")

    status = {"specs": {"dropout": HParam(0.1, low=0.0, high=0.99).to_wire()},
              "hparams": {"dropout": 0.1}, "world_size": 2, "state": "running"}
    panel = ControlPanel(Job(), status, lambda call, done: _run(call, done))
    row = panel.rows["dropout"]
    row.control.value = 0.95
    assert "above the maximum 0.9" in row.error.value
    assert row.control.value == 0.1 and row.value == 0.1


def test_an_ack_shows_the_step_and_commands_follow_the_state():
    job = SimpleNamespace(
        set=lambda values, source: Ack("c1", 77, dict(values)),
        pause=lambda source: Ack("c2", 80, {}, "paused"),
        resume=lambda source: Ack("c3", 81, {}, "running"),
        stop=lambda source: Ack("c4", 82, {}, "stopping"),
        checkpoint=lambda source: Ack("c5", 80, {}, "checkpoint", "/runs/j/step-80.pt"))
    status = {"specs": {"lr": BUILTINS["lr"].to_wire()}, "hparams": {"lr": 0.1},
              "world_size": 1, "state": "running", "last_changed": {"lr": 3}}
    panel = ControlPanel(job, status, lambda call, done: _run(call, done))
    assert "since step 3" in panel.rows["lr"].state.value
    panel.rows["lr"].control.value = 0.02
    assert "since step 77 (widget)" in panel.rows["lr"].state.value
    panel.buttons["pause"].click()
    assert "paused" in panel.badge.value and panel.buttons["pause"].disabled
    assert not panel.buttons["resume"].disabled
    panel.buttons["checkpoint"].click()  # allowed while paused; the state stays
    assert "checkpoint at step 80: /runs/j/step-80.pt" in panel.acked.value
    assert "paused" in panel.badge.value and not panel.buttons["checkpoint"].disabled
    panel.set_state("finished")
    assert all(b.disabled for b in panel.buttons.values())
    assert panel.rows["lr"].control.disabled


def _run(call, done):
    try:
        result = call()
    except Exception as exc:
        done(None, exc)
    else:
        done(result, None)


def test_values_released_while_one_is_on_its_way_collapse_into_the_last():
    sent, waiting = [], []
    job = SimpleNamespace(set=lambda values, source: sent.append(values["dropout"]) or
                          Ack(f"c{len(sent)}", 10 * len(sent), dict(values)))
    status = {"specs": {"dropout": HParam(0.1, low=0.0, high=0.9).to_wire()},
              "hparams": {"dropout": 0.1}, "world_size": 1, "state": "running"}
    panel = ControlPanel(job, status, lambda call, done: waiting.append((call, done)))
    row = panel.rows["dropout"]
    for v in (0.2, 0.3, 0.4, 0.5):
        row.control.value = v
    assert len(waiting) == 1  # the first is on its way; the others wait
    call, done = waiting.pop()
    done(call(), None)  # its answer sends the newest waiting value, once
    assert len(waiting) == 1
    call, done = waiting.pop()
    done(call(), None)
    assert sent == [0.2, 0.5] and not waiting
    assert row.value == 0.5 and "since step 20" in row.state.value
