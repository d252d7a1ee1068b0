import pytest
import torch

from hpinteract.protocol.errors import InvalidHParam
from hpinteract.protocol.hparams import HParam, build_specs
from hpinteract.trainer.batching import batch_constraint
from hpinteract.trainer.effect import OptimizerBinding
from hpinteract.trainer.store import HParamStore


def test_lr_keeps_group_ratios_and_weight_decay_spares_groups_without_it():
    w, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [w], "weight_decay": 1e-4},
                           {"params": [b], "lr": 0.01, "weight_decay": 0.0}],
                          lr=0.1, momentum=0.9)
    binding = OptimizerBinding(opt)
    binding.apply({"lr": 0.2, "weight_decay": 1e-3, "momentum": 0.5})
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.2, 0.02])
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-3, 0.0]
    assert [g["momentum"] for g in opt.param_groups] == [0.5, 0.5]


def test_momentum_is_adams_beta1_and_schedulers_follow_lr():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([p], lr=0.1, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    binding = OptimizerBinding(opt, sched)
    assert binding.read()["momentum"] == 0.9
    binding.apply({"momentum": 0.8, "lr": 0.4})
    assert opt.param_groups[0]["betas"] == (0.8, 0.99)
    assert sched.base_lrs == [0.4]  # else the next scheduler step would undo the change


def test_store_validates_without_applying_and_calls_on_change_on_apply():
    calls = []
    specs = build_specs({"batch_size": 8}, {"drop": HParam(0.1, low=0, high=1,
                                            on_change=lambda *a: calls.append(a))})
    store = HParamStore(specs)
    store.add_constraint(batch_constraint(4))
    with pytest.raises(InvalidHParam, match="cannot be shared by 4 ranks"):
        store.validate({"batch_size": 10})
    assert store.validate({"drop": 0.5}) == {"drop": 0.5}
    assert store.view["drop"] == 0.1 and not calls
    store.apply({"drop": 0.5}, step=7)
    assert store.view["drop"] == 0.5 and calls == [("drop", 0.1, 0.5)]
    assert store.last_changed["drop"] == 7


def _warmup(steps: int = 10):
    w, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [w]}, {"params": [b], "lr": 0.2}], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: s / steps)  # from 0, as HF's
    return opt, sched


def test_a_set_lr_under_a_lambda_schedule_is_the_next_steps_and_the_shape_goes_on():
    opt, sched = _warmup()
    binding = OptimizerBinding(opt, sched)  # the groups' lr are 0 here: ratios from the base
    for _ in range(4):
        opt.step()
        sched.step()
    binding.apply({"lr": 0.01})  # factor 0.4 now
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.01, 0.02])
    assert sched.get_last_lr() == pytest.approx([0.01, 0.02])
    opt.step()
    sched.step()  # factor 0.5: the schedule's next value, times 0.01 / (0.1 * 0.4)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.0125, 0.025])


def test_a_set_lr_where_the_schedule_is_at_zero_becomes_its_base():
    opt, sched = _warmup()
    OptimizerBinding(opt, sched).apply({"lr": 0.05})  # step 0: factor 0
    assert opt.param_groups[0]["lr"] == 0.05 and sched.base_lrs == pytest.approx([0.05, 0.1])


def test_a_scheduler_with_its_own_bounds_fixes_lr_with_the_reason():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    cycle = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=100)
    binding = OptimizerBinding(opt, cycle)
    assert "OneCycleLR sets it at every step" in binding.why_fixed("lr")
    assert binding.why_fixed("momentum")  # cycle_momentum: its momentum too
    assert binding.why_fixed("weight_decay") == ""
    assert OptimizerBinding(opt, torch.optim.lr_scheduler.StepLR(opt, 10)).why_fixed("lr") == ""
