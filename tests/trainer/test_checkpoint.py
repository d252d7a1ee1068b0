"""Checkpoint files: atomic writes, the index, pruning, safe loading (no job needed)."""

from __future__ import annotations

import pickle
import threading

import pytest
import torch
from torch import nn

from hpinteract.protocol.errors import CheckpointError
from hpinteract.protocol.rundir import read_checkpoint_index
from hpinteract.trainer import checkpoint as ck


def state_at(step: int, model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    return ck.capture(model, opt, None, step=step, epoch=0, loader={"epoch": 0, "position": 8},
                      hparams={"lr": 0.1}, last_changed={"lr": 3})


def write_all(writer: ck.CheckpointWriter, items: list[tuple[dict, bool]]) -> list[ck.Written]:
    woke = threading.Event()
    writer._wake = woke.set
    for state, periodic in items:
        writer.submit(state, None, periodic)
    writer.close()
    return writer.finished()


@pytest.fixture
def model_opt():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # momentum buffers exist
    return model, opt


def test_capture_copies_the_state_so_later_steps_do_not_change_it(model_opt):
    model, opt = model_opt
    state = state_at(5, model, opt)
    with torch.no_grad():
        model.weight.add_(1.0)
    assert not torch.equal(state["model"]["weight"], model.weight)
    assert state["optimizer"]["state"][0]["momentum_buffer"].shape == (2, 4)


def test_capture_unwraps_ddp_style_wrappers(model_opt):
    model, opt = model_opt
    wrapper = nn.Module()
    wrapper.module = model  # what DDP and torch.compile look like from outside
    assert set(state_at(0, wrapper, opt)["model"]) == {"weight", "bias"}


def test_written_checkpoints_load_back_and_are_indexed(tmp_path, model_opt):
    model, opt = model_opt
    done = write_all(ck.CheckpointWriter(tmp_path / "c", lambda: None),
                     [(state_at(10, model, opt), False)])
    assert [w.error for w in done] == [None] and done[0].step == 10
    path = done[0].path
    assert path is not None and oct(path.stat().st_mode & 0o777) == "0o600"
    loaded = ck.load(path)
    assert torch.equal(loaded["model"]["weight"], model.weight.detach())
    assert loaded["loader"] == {"epoch": 0, "position": 8} and loaded["last_changed"] == {"lr": 3}
    restored = nn.Linear(4, 2)
    restored.load_state_dict(loaded["model"])  # torch's own loaders take it as it is
    opt2 = torch.optim.SGD(restored.parameters(), lr=0.5, momentum=0.9)
    opt2.load_state_dict(loaded["optimizer"])
    assert [e["step"] for e in read_checkpoint_index(tmp_path / "c")] == [10]


def test_only_the_newest_periodic_checkpoints_are_kept_and_requested_ones_stay(tmp_path,
                                                                               model_opt):
    model, opt = model_opt
    items = [(state_at(s, model, opt), s != 15) for s in (5, 10, 15, 20, 25)]
    write_all(ck.CheckpointWriter(tmp_path, lambda: None), items)
    index = read_checkpoint_index(tmp_path)
    assert [(e["step"], e["periodic"]) for e in index] == [(15, False), (20, True), (25, True)]
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == [e["file"] for e in index]
    # A periodic checkpoint at the step of an asked-for one does not make it prunable.
    write_all(ck.CheckpointWriter(tmp_path, lambda: None),
              [(state_at(s, model, opt), True) for s in (15, 30, 35)])
    assert [e["step"] for e in read_checkpoint_index(tmp_path)] == [15, 30, 35]


def test_a_write_that_fails_midway_leaves_the_previous_checkpoint_intact(tmp_path, model_opt,
                                                                         monkeypatch):
    model, opt = model_opt
    writer = ck.CheckpointWriter(tmp_path, lambda: None)
    write_all(writer, [(state_at(10, model, opt), False)])
    before = (tmp_path / "step-000000010.pt").read_bytes()

    def crash(obj, f, *a, **k):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(ck.torch, "save", crash)
    done = write_all(ck.CheckpointWriter(tmp_path, lambda: None),
                     [(state_at(20, model, opt), False), (state_at(10, model, opt), False)])
    assert len(done) == 2
    assert all(w.path is None and "disk full" in (w.error or "") for w in done)
    assert (tmp_path / "step-000000010.pt").read_bytes() == before
    assert [e["step"] for e in read_checkpoint_index(tmp_path)] == [10]
    assert not list(tmp_path.glob(".*.tmp")) and not (tmp_path / "step-000000020.pt").exists()


class Boom:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_load_refuses_foreign_files_and_pickled_code(tmp_path, capsys):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        ck.load(tmp_path / "junk.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not an hpinteract checkpoint"):
        ck.load(tmp_path / "other.pt")
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"format": ck.FORMAT, "x": Boom()}, f, protocol=2)
    with pytest.raises(CheckpointError, match="Weights only load failed"):
        ck.load(tmp_path / "evil.pt")
    assert "must never run" not in capsys.readouterr().out
