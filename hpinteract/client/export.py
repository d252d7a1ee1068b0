"""A job's history in the tools people already use: TensorBoard event files.

Runs in: the user's process (a notebook kernel or the ``hpinteract export`` command), from
the run directory's logs alone (a job need not be running). Writes with TensorBoard's
own event writer and protocol buffers, so the client still never imports torch
(``torch.utils.tensorboard`` wraps the same writer). Every metric is a scalar at its
step; every applied change is a text event at the step it took effect ("lr 0.1 -> 0.01
by cli: reason"), as are resumes, restarts and resizes. A step run again after a resume
or restart keeps its last value, as the dashboard draws it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..protocol.changes import Applied
from ..protocol.errors import ConfigError
from ..protocol.rundir import RunDir
from .bulk import columns, load_history
from .history import read_records

FORMATS = ("tensorboard",)
SUFFIX = ".hpinteract"  # our event files: an export again replaces them
BOOKKEEPING = frozenset({"epoch", "time", "eval"})
CHANGES_TAG, EVENTS_TAG = "hpinteract/changes", "hpinteract/events"


def export(run_dir: RunDir, fmt: str, path: str | Path) -> Path:
    """Write the job's history as ``fmt`` under ``path``; the directory written."""
    if fmt not in FORMATS:
        raise ConfigError(f"export format {fmt!r}: one of {', '.join(FORMATS)}")
    return tensorboard(run_dir, Path(path))


def _writer(logdir: Path) -> Any:
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise ConfigError("exporting to TensorBoard needs the tensorboard package: "
                          "pip install 'hpinteract[tensorboard]'") from None
    for old in logdir.glob(f"events.out.tfevents.*{SUFFIX}"):
        old.unlink()
    return EventFileWriter(str(logdir), filename_suffix=SUFFIX)


def tensorboard(run_dir: RunDir, path: Path) -> Path:
    """One TensorBoard run per job: ``path/<job id>``, its event file written afresh."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    cols, events = _everything(run_dir)
    logdir = path / run_dir.job_id
    logdir.mkdir(parents=True, exist_ok=True)
    writer = _writer(logdir)
    clock = _clock(cols.get("time"))
    by_step: dict[int, list[Any]] = {}
    for name, (xs, ys) in sorted(cols.items()):
        if name in BOOKKEEPING:
            continue
        steps, values = _last_per_step(xs, ys)
        for step, value in zip(steps.tolist(), values.tolist(), strict=True):
            by_step.setdefault(step, []).append(Summary.Value(tag=name, simple_value=value))
    # In step order, texts and scalars together, those of one step as one text: TensorBoard
    # takes a step lower than the last it read for a restart, and drops what it had read
    # from that step on, on every tag.
    texts: dict[int, dict[str, list[str]]] = {}
    for ev in events:
        tagged = _text_of(ev)
        if tagged is not None:
            tag, step, text = tagged
            texts.setdefault(step, {}).setdefault(tag, []).append(text)
    for step in sorted(set(by_step) | set(texts)):
        values = by_step.get(step, []) + [_text_value(tag, "  \n".join(lines))
                                          for tag, lines in texts.get(step, {}).items()]
        writer.add_event(Event(step=step, wall_time=clock(step),
                               summary=Summary(value=values)))
    writer.close()
    return logdir


def _everything(run_dir: RunDir) -> tuple[dict[str, tuple[Any, Any]], list[dict[str, Any]]]:
    """Every metric as columns and every event: the columnar copy where the job has one
    (bulk.load_history, as the dashboard reads it), then the JSON-lines logs after it."""
    hist = load_history(run_dir)
    cols = {n: (np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64))
            for n, (xs, ys) in hist.columns.items()}
    for name, (xs, ys) in columns(read_records(run_dir.metrics_log,
                                               since=hist.last_seq)).items():
        old_xs, old_ys = cols.get(name, (np.empty(0), np.empty(0)))
        cols[name] = (np.concatenate([old_xs, xs]), np.concatenate([old_ys, ys]))
    return cols, hist.events + read_records(run_dir.events_log, since=hist.last_seq)


def _last_per_step(xs: Any, ys: Any) -> tuple[Any, Any]:
    """Each step once, with its last value (a step run again replaces the first run's)."""
    xs, ys = np.asarray(xs, dtype=np.int64), np.asarray(ys, dtype=np.float64)
    steps, first_from_end = np.unique(xs[::-1], return_index=True)
    values = ys[::-1][first_from_end]
    keep = np.isfinite(values)
    return steps[keep], values[keep]


def _clock(times: tuple[Any, Any] | None) -> Any:
    """step -> the wall time the job logged it at (0 where unknown)."""
    if times is None or not len(times[0]):
        return lambda step: 0.0
    steps, walls = _last_per_step(*times)
    return lambda step: float(walls[min(int(np.searchsorted(steps, step)), len(steps) - 1)])


def _text_of(ev: dict[str, Any]) -> tuple[str, int, str] | None:
    """(tag, step, markdown) for an event worth seeing next to the curves."""
    kind, change = ev.get("kind"), Applied.of(ev)
    if change is not None:
        prev = change.previous
        parts = [f"**{n}** {prev[n]!r} → {v!r}" if n in prev else f"**{n}** → {v!r}"
                 for n, v in change.values.items()]
        why = f": {change.reason}" if change.reason else ""
        return CHANGES_TAG, change.step, f"{', '.join(parts)} (by {change.source}){why}"
    if kind in ("resume", "restart", "fork"):
        return EVENTS_TAG, int(ev.get("step") or 0), \
            f"{kind} from the checkpoint at step {ev.get('step')}"
    if kind == "resize" and ev.get("status") == "done":
        return EVENTS_TAG, int(ev.get("step") or 0), \
            f"resized from {ev.get('from')} to {ev.get('to')} ranks"
    return None


def _text_value(tag: str, text: str) -> Any:
    """A TensorBoard text summary (its text plugin's format)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name="text", content=TextPluginData(version=0).SerializeToString()))
    tensor = TensorProto(dtype="DT_STRING", string_val=[text.encode()],
                         tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    return Summary.Value(tag=tag, metadata=meta, tensor=tensor)
