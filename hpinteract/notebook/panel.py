"""The control panel: one control per hyper-parameter, generated from the job's specs,
plus pause / resume / stop / checkpoint, a state badge, progress and errors.

Runs in: the notebook kernel. Widget callbacks run on the kernel's main thread; the job's
commands block until a step boundary, so they run on the dashboard's worker thread and
their results come back through ``Dashboard``'s event-loop task, which is the only code
that touches the widgets afterwards (ipykernel 7: no widget updates from other threads).
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as w
from traitlets import TraitError

from ..client.values import parse_value
from ..protocol.errors import HpiError
from ..protocol.hparams import SYSTEM, HParam
from ..protocol.states import JobState

Submit = Callable[[Callable[[], Any], Callable[[Any, BaseException | None], None]], None]


BADGE = {  # state -> colour of its badge
    "starting": "#6c757d", "running": "#198754", "paused": "#fd7e14", "stopping": "#6c757d",
    "finished": "#0d6efd", "failed": "#dc3545", "stopped": "#6c757d",
}


def batch_choices(current: int, spec: HParam, unit: int) -> list[int]:
    """Batch sizes the ranks can share (multiples of ``unit`` = micro_batch x world, or the
    world size), doubling from the smallest, within the spec's bounds; with the current."""
    lo = max(unit, int(spec.low) if spec.low is not None else unit)
    lo = -(-lo // unit) * unit
    hi = int(spec.high) if spec.high is not None else max(current, lo) * 32
    out, b = {current}, lo
    while b <= hi and len(out) < 24:
        out.add(b)
        b *= 2
    return sorted(v for v in out if v % unit == 0 or v == current)


def control_for(name: str, spec: HParam, value: Any, unit: int) -> w.ValueWidget:
    """The widget for one hyper-parameter: a log slider for lr (or any ``log`` spec), valid
    batch sizes, sizes of the job (``workers``), bounded sliders, dropdowns for choices, a
    checkbox, else a text box."""
    common: dict[str, Any] = {"description": "", "layout": w.Layout(width="320px")}
    if spec.choices is not None:
        return w.Dropdown(options=list(spec.choices), value=value, **common)
    if spec.kind == "bool":
        return w.Checkbox(value=bool(value), indent=False, **common)
    if name == "batch_size" and spec.kind == "int":
        return w.Dropdown(options=batch_choices(int(value), spec, unit), value=int(value),
                          **common)
    if name == "workers" and spec.kind == "int":  # a resize restarts the job: no slider
        top = int(spec.high) if spec.high is not None else 64
        sizes = {int(value), *range(1, min(top, 8) + 1),
                 *(2**k for k in range(3, 7) if 2**k <= top)}
        return w.Dropdown(options=sorted(sizes), value=int(value), **common)
    numeric = spec.kind in ("int", "float")
    if numeric and (spec.log or name == "lr") and spec.kind == "float" and value > 0:
        lo = math.log10(spec.low) if spec.low and spec.low > 0 else math.log10(value) - 3
        hi = math.log10(spec.high) if spec.high and spec.high > 0 else math.log10(value) + 2
        return w.FloatLogSlider(value=value, base=10, min=lo, max=hi, step=0.01,
                                readout_format=".3g", continuous_update=False, **common)
    if numeric and spec.low is not None and spec.high is not None:
        if spec.kind == "int":
            return w.IntSlider(value=value, min=int(spec.low), max=int(spec.high),
                               continuous_update=False, **common)
        return w.FloatSlider(value=value, min=spec.low, max=spec.high,
                             step=(spec.high - spec.low) / 200, readout_format=".3g",
                             continuous_update=False, **common)
    return w.Text(value=str(value), continuous_update=False, **common)


def _from_text(spec: HParam, text: str) -> Any:
    """A text box's value as the spec's kind; the job validates it again."""
    return parse_value(text) if spec.kind != "str" else text


class HParamRow:
    """One hyper-parameter: label, control, its effective value and since when, errors."""

    def __init__(self, name: str, spec: HParam, value: Any, unit: int,
                 apply: Callable[[str, Any], None]) -> None:
        self.name, self.spec, self.value = name, spec, value
        self.control = control_for(name, spec, value, unit)
        self.text = isinstance(self.control, w.Text)
        self.label = w.HTML(f"<b>{html.escape(name)}</b>", layout=w.Layout(width="130px"),
                            tooltip=spec.doc or None)
        self.state = w.HTML(layout=w.Layout(width="230px"))
        self.error = w.HTML()
        self.button = w.Button(description="Apply", layout=w.Layout(width="70px"),
                               disabled=True)
        self._echo = False  # True while the panel itself moves the control
        self._since: int | None = None  # the step and source of the last applied change
        self._source: str | None = None
        self._apply = apply
        self.control.observe(self._changed, names="value")
        self.button.on_click(lambda _: self._submit())
        parts = [self.label, self.control] + ([self.button] if self.text else [])
        self.box = w.VBox([w.HBox([*parts, self.state]), self.error])
        self.show(value, None)

    def _changed(self, change: dict[str, Any]) -> None:
        if self._echo:
            return
        if self.text:  # typed text waits for Apply (or Enter: continuous_update=False)
            self.button.disabled = False
        self._submit()

    def _submit(self) -> None:
        try:
            v = _from_text(self.spec, self.control.value) if self.text else self.control.value
        except HpiError as exc:
            self.fail(exc.message)
            return
        if v == self.value:
            self.button.disabled = True
            return
        self.error.value = ""
        self.state.value = f"<i>applying {html.escape(repr(v))}…</i>"
        self._apply(self.name, v)

    def show(self, value: Any, step: int | None, source: str | None = None) -> None:
        """The job's effective value (after an ack, or a change from anywhere else)."""
        self.value = value
        since = f" · since step {step}" if step is not None else ""
        by = f" ({html.escape(source)})" if source else ""
        self.state.value = f"= <code>{html.escape(_fmt(value))}</code>{since}{by}"
        self._echo = True
        try:
            if isinstance(self.control, w.Dropdown) and value not in self.control.options:
                self.control.options = sorted([*self.control.options, value])
            self.control.value = str(value) if self.text else value
        except TraitError:  # the control cannot show it (its label above still does)
            pass
        finally:
            self._echo = False
        self.button.disabled = True

    def fail(self, message: str) -> None:
        """The job refused the value: say why, put the control back, nothing applied."""
        self.error.value = f"<span style='color:#dc3545'>✗ {html.escape(message)}</span>"
        self.show(self.value, self._since, self._source)

    def applied(self, value: Any, step: int, source: str) -> None:
        self._since, self._source = step, source
        self.error.value = ""
        self.show(value, step, source)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class ControlPanel:
    """The dashboard's controls for one job; ``submit`` runs a blocking call off the event
    loop and calls back on it."""

    def __init__(self, job: Any, status: dict[str, Any], submit: Submit) -> None:
        self.job, self._submit = job, submit
        specs = {n: HParam.from_wire(s) for n, s in status.get("specs", {}).items()}
        values = status.get("hparams", {})
        plan = status.get("plan") or {}
        world = int(status.get("world_size") or 1)
        unit = world * int(plan.get("micro_batch") or 1) if "micro_batch" in values else world
        last = status.get("last_changed") or {}
        self.rows: dict[str, HParamRow] = {}
        # Rows with a change on its way: name -> (the newest value waiting,) or None.
        self._inflight: dict[str, tuple[Any] | None] = {}
        for name in sorted(specs):
            if name in values:
                row = HParamRow(name, specs[name], values[name], unit, self._apply)
                if isinstance(last.get(name), int):
                    row._since = last[name]
                    row.show(values[name], last[name])
                self.rows[name] = row
        self.badge = w.HTML()
        self.progress = w.FloatProgress(min=0.0, max=1.0, layout=w.Layout(width="260px"))
        self.where = w.HTML()  # progress: step, epoch, ETA
        self.acked = w.HTML()  # the last command's acknowledgement
        self.errors = w.HTML()
        self.buttons = {op: w.Button(description=op.capitalize(), icon=icon,
                                     layout=w.Layout(width="110px"))
                        for op, icon in (("pause", "pause"), ("resume", "play"),
                                         ("stop", "stop"), ("checkpoint", "save"))}
        for op, b in self.buttons.items():
            b.on_click(lambda _, op=op: self._command(op))
        head = w.HBox([self.badge, self.progress, self.where, *self.buttons.values(),
                       self.acked])
        main = [r.box for n, r in self.rows.items() if n not in SYSTEM]
        system = [r.box for n, r in self.rows.items() if n in SYSTEM]
        grid = w.GridBox(main, layout=w.Layout(
            grid_template_columns="repeat(auto-fill, minmax(700px, 1fr))"))
        more = w.Accordion([w.VBox(system)],
                           titles=("system: monitors, checkpoints, sync, workers",),
                           selected_index=None)
        self.widget = w.VBox([head, self.errors, grid, *([more] if system else [])])
        self._p0: tuple[float, float] | None = None  # (time, progress) when first seen
        self.set_state(str(status.get("state", "starting")))

    # ---- commands (results arrive on the event loop) --------------------------------------
    def _apply(self, name: str, value: Any) -> None:
        """Send a row's new value. While one is on its way, newer ones wait and only the
        last is sent (a slider released five times in a second is one more change, not
        five): debounced by the round trip itself."""
        if name in self._inflight:
            self._inflight[name] = (value,)
            return
        self._inflight[name] = None
        row = self.rows[name]

        def done(ack: Any, exc: BaseException | None) -> None:
            later = self._inflight.pop(name, None)
            if exc is not None:
                row.fail(getattr(exc, "message", None) or str(exc))
            else:
                row.applied(ack.values.get(name, value), ack.applied_at_step, "widget")
            if later is not None and later[0] != row.value:
                self._apply(name, later[0])

        self._submit(lambda: self.job.set({name: value}, source="widget"), done)

    def _command(self, op: str) -> None:
        def done(ack: Any, exc: BaseException | None) -> None:
            if exc is not None:
                self.report(f"{op}: {getattr(exc, 'message', None) or exc}")
            elif op != "checkpoint":
                self.set_state(ack.state or op)
                self.acked.value = f"{op} at step {ack.applied_at_step}"
            else:
                where = f": {html.escape(ack.path)}" if ack.path else ""
                self.acked.value = f"checkpoint at step {ack.applied_at_step}{where}"

        call = getattr(self.job, op)
        self._submit(lambda: call(source="widget"), done)

    # ---- what the job says (the event loop) -----------------------------------------------
    def on_change(self, event: dict[str, Any]) -> None:
        """A change event from the job's log: show it on its rows (whatever its source)."""
        if event.get("status") != "applied":
            return
        for name, value in (event.get("values") or {}).items():
            if name in self.rows:
                self.rows[name].applied(value, int(event.get("applied_at_step", 0)),
                                        str(event.get("source", "?")))

    def on_metrics(self, rec: dict[str, Any], epochs: int | None) -> None:
        frac = rec.get("progress")
        text = f"step {int(rec.get('step', 0)):,}" + (f" · epoch {rec['epoch']}" +
                                   (f"/{epochs}" if epochs else "") if "epoch" in rec else "")
        if isinstance(frac, int | float) and 0 < frac <= 1:
            self.progress.value = float(frac)
            # The rate since this panel opened (a reopened dashboard has seen none before).
            now = time.time()
            if self._p0 is None:
                self._p0 = (now, float(frac))
            t0, f0 = self._p0
            if f0 < frac < 1 and now - t0 > 1:
                text += f" · ETA {_duration((now - t0) / (frac - f0) * (1 - frac))}"
        self.where.value = text

    def set_state(self, state: str) -> None:
        colour = BADGE.get(state, "#6c757d")
        self.badge.value = (f"<span style='background:{colour};color:white;padding:2px 8px;"
                            f"border-radius:8px'>{html.escape(state)}</span>")
        ended = state in {s.value for s in JobState if s.terminal}
        for op, b in self.buttons.items():
            b.disabled = ended or (op == "pause" and state == "paused") or \
                (op == "resume" and state != "paused")
        for row in self.rows.values():
            row.control.disabled = ended

    def report(self, message: str) -> None:
        self.errors.value = (f"<pre style='color:#dc3545;white-space:pre-wrap'>"
                             f"{html.escape(message)}</pre>")


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
