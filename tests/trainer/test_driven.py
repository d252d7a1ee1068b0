"""Changes held for a framework's epoch boundary (trainer/driven.py), below the ranks."""

from hpinteract.trainer.commands import Command
from hpinteract.trainer.driven import Driven


def cmd(op: str, **values) -> Command:
    return Command(op, f"{op}-{sorted(values)}", "api", values)


def test_epoch_changes_wait_for_the_boundary_and_go_out_in_order():
    d = Driven("x", lambda hp: (1, 1), lambda c, s: None, frozenset({"batch_size"}))
    batch, lr, pause = cmd("set", batch_size=64, lr=0.1), cmd("set", lr=0.2), cmd("pause")
    assert d.gate([batch, lr, pause]) == [lr, pause]  # a set naming batch_size waits whole
    later = cmd("set", batch_size=128)
    assert d.gate([later]) == [] and d.held == [batch, later]
    d.releasing = True
    assert d.gate([lr]) == [batch, later, lr] and d.held == []


def test_without_epoch_names_nothing_waits():
    d = Driven("x", lambda hp: (1, 1), lambda c, s: None)
    c = cmd("set", batch_size=64)
    assert d.gate([c]) == [c]
