"""Checkpoints: what a job needs to continue where it was, written so a crash loses nothing.

Runs in: rank 0. At a sync point the training thread takes a CPU copy of the model,
optimizer, scheduler, loader position and effective hyper-parameters (``capture``); the
coordinator adds what it owns (the policies' state and the change history: a coordinator
process sends them, control_process.py) and the whole goes to a ``CheckpointWriter``
thread of rank 0, which serialises it with ``torch.save``. The
training loop pays for one copy of the state, not for the disk.

Under DDP every rank holds the same parameters and optimizer state, so rank 0's copy is the
job's: this is torch's own recipe for DDP (``torch.distributed.checkpoint`` is for sharded
state, which DDP does not have). A file is written to a temporary name, fsynced and renamed
into place, then the directory is fsynced: a crash mid-write leaves the previous checkpoint
and ``index.json`` intact. Files are loaded with ``weights_only=True``: tensors and plain
containers only, never arbitrary pickled objects.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..protocol.errors import CheckpointError
from ..protocol.rundir import atomic_write_json, read_checkpoint_index

FORMAT = 1
KEEP_PERIODIC = 2  # periodic checkpoints kept (the newest); ones asked for are all kept


def _cpu(obj: Any) -> Any:
    """A deep copy with every tensor on the CPU (a GPU tensor is copied off the device)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_cpu(v) for v in obj)
    return obj


def unwrap(model: Any) -> Any:
    """The module under DDP (or torch.compile): its state_dict keys are the user's own."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def capture(model: Any, optimizer: Any, scheduler: Any, *, step: int, epoch: int,
            loader: dict[str, int] | None, hparams: dict[str, Any],
            last_changed: dict[str, int]) -> dict[str, Any]:
    """The training thread's part: a consistent CPU copy of everything it owns.

    ``step`` is the index of the next step: the state is the one before that step runs.
    """
    import numpy as np

    return {
        "format": FORMAT, "step": step, "epoch": epoch, "loader": loader,
        "model": _cpu(unwrap(model).state_dict()),
        "optimizer": _cpu(optimizer.state_dict()) if optimizer is not None else None,
        "scheduler": _cpu(scheduler.state_dict()) if scheduler is not None else None,
        "hparams": dict(hparams), "last_changed": dict(last_changed),
        # Rank 0's generators: data order comes from the loader's seed and epoch, these
        # cover what the script draws itself (dropout, augmentation).
        "rng": {"torch": torch.get_rng_state(), "python": _python_rng(),
                "numpy": _numpy_rng(np),
                # On GPUs, dropout draws from the CUDA generators (no device sync: a copy).
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
    }


def _python_rng() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _numpy_rng(np: Any) -> dict[str, Any]:
    state = np.random.get_state(legacy=False)
    inner = state["state"]
    return {"bit_generator": state["bit_generator"], "pos": int(inner["pos"]),
            "key": torch.from_numpy(inner["key"].astype("int64")),
            "has_gauss": int(state["has_gauss"]), "gauss": float(state["gauss"])}


@dataclass
class Written:
    """The outcome of one write, handed back to the coordinator."""

    token: Any  # the coordinator's own (the command it answers)
    step: int
    path: Path | None
    error: str | None
    seconds: float
    size: int


class CheckpointWriter:
    """One thread that writes checkpoints in the order they were captured."""

    def __init__(self, directory: Path, wake: Callable[[], None]) -> None:
        self.directory = directory
        self._wake = wake
        self._todo: queue.SimpleQueue[tuple[dict[str, Any], Any, bool] | None] = (
            queue.SimpleQueue())
        self._done: queue.SimpleQueue[Written] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="hpi-checkpoint", daemon=True)
        self._thread.start()

    def submit(self, state: dict[str, Any], token: Any, periodic: bool) -> None:
        self._todo.put((state, token, periodic))

    def finished(self) -> list[Written]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def close(self, timeout: float = 120.0) -> None:
        """Write what was submitted, then stop."""
        self._todo.put(None)
        self._thread.join(timeout)

    def _main(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            state, token, periodic = item
            t0 = time.perf_counter()
            step = int(state["step"])
            try:
                path = self._write(state, periodic)
                size = path.stat().st_size
                result = Written(token, step, path, None, time.perf_counter() - t0, size)
            except Exception as exc:  # the job trains on; the requester is told why
                result = Written(token, step, None, f"{type(exc).__name__}: {exc}",
                                 time.perf_counter() - t0, 0)
            self._done.put(result)
            self._wake()

    def _write(self, state: dict[str, Any], periodic: bool) -> Path:
        self.directory.mkdir(mode=0o700, exist_ok=True)
        step = int(state["step"])
        path = self.directory / f"step-{step:09d}.pt"
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())  # the data is on disk before the name points at it
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(self.directory)
        self._index(step, path, periodic, state)
        return path

    def _index(self, step: int, path: Path, periodic: bool, state: dict[str, Any]) -> None:
        entries = read_checkpoint_index(self.directory)
        # The same step asked for and periodic is one file, kept as asked for.
        periodic = periodic and all(e.get("periodic") for e in entries if e["step"] == step)
        entries = [e for e in entries if e["step"] != step]
        entries.append({"step": step, "file": path.name, "periodic": periodic,
                        "epoch": state.get("epoch"), "time": time.time()})
        entries.sort(key=lambda e: e["step"])
        periodic_steps = [e["step"] for e in entries if e["periodic"]]
        drop = set(periodic_steps[:-KEEP_PERIODIC])
        atomic_write_json(self.directory / "index.json",
                          {"format": FORMAT, "checkpoints": [e for e in entries
                                                             if e["step"] not in drop]})
        _fsync_dir(self.directory)
        for e in entries:  # only once the index no longer names them
            if e["step"] in drop:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / e["file"])


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by ``CheckpointWriter`` (tensors and plain data only)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an hpinteract checkpoint (format {FORMAT})")
    return state
