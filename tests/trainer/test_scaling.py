"""lr_scaling's rules, and the command rank 0 appends after a batch change."""

import math

import pytest

from hpinteract.protocol.hparams import BUILTINS
from hpinteract.trainer.commands import Command
from hpinteract.trainer.scaling import scaled_lr, with_lr_scaling


def test_the_rules_follow_the_batch_ratio():
    assert scaled_lr("linear", 0.1, 32, 64, None)[0] == pytest.approx(0.2)
    assert scaled_lr("sqrt", 0.1, 32, 128, None)[0] == pytest.approx(0.2)
    assert scaled_lr("none", 0.1, 32, 64, None)[0] is None
    # AdaScale: linear while the noise dominates, flat once the gradient does.
    assert scaled_lr("adascale", 0.1, 32, 64, 1e9)[0] == pytest.approx(0.2, rel=1e-6)
    assert scaled_lr("adascale", 0.1, 32, 64, 1e-9)[0] == pytest.approx(0.1, rel=1e-6)
    lr, why = scaled_lr("adascale", 0.1, 32, 64, 64.0)
    assert lr == pytest.approx(0.1 * (1 + 2) / (1 + 1)) and "noise scale 64" in why
    assert scaled_lr("adascale", 0.1, 32, 64, math.nan)[0] is None


def test_a_batch_change_gets_an_lr_change_of_its_own_unless_lr_is_set_too():
    hp = {"lr": 0.1, "batch_size": 32, "lr_scaling": "linear"}
    specs = {"lr": BUILTINS["lr"]}
    out = with_lr_scaling([Command("set", "a", "api", {"batch_size": 64})], hp, specs,
                          lambda: None)
    assert [c.source for c in out] == ["api", "lr_scaling"]
    assert out[1].values == {"lr": pytest.approx(0.2)} and not out[1].tracked
    assert "batch_size 32 -> 64" in out[1].reason
    both = with_lr_scaling([Command("set", "b", "api", {"batch_size": 64, "lr": 0.5})], hp,
                           specs, lambda: None)
    assert len(both) == 1  # the person's lr wins
