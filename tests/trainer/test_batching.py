"""The global batch on ranks, micro-batches and accumulation (one process, ranks simulated)."""

from collections import Counter

import pytest
import torch

from hpinteract.protocol.errors import InvalidHParam
from hpinteract.protocol.hparams import build_specs
from hpinteract.trainer.batching import batch_constraint, plan_of
from hpinteract.trainer.loader import _Slices
from hpinteract.trainer.store import HParamStore


def store(world, **values):
    s = HParamStore(build_specs(values))
    s.add_constraint(batch_constraint(world))
    return s


def test_the_plan_derives_accumulation_from_the_global_batch():
    assert plan_of({"batch_size": 64}, 2) == (32, 1)
    assert plan_of({"batch_size": 64, "micro_batch": 8}, 2) == (8, 4)
    assert plan_of({"batch_size": 64, "micro_batch": 8}, 1) == (8, 8)


def test_impossible_splits_are_rejected_naming_the_field_and_a_fix():
    s = store(2, batch_size=64, micro_batch=16)
    with pytest.raises(InvalidHParam) as e:
        s.validate({"batch_size": 48})
    assert e.value.field == "batch_size"
    assert "24 samples per rank" in e.value.message and "multiple of 32" in e.value.message
    assert "e.g. 32 or 64" in e.value.message
    with pytest.raises(InvalidHParam) as e:
        s.validate({"micro_batch": 12})
    assert e.value.field == "micro_batch" and "divides 32" in e.value.message
    with pytest.raises(InvalidHParam, match="cannot be shared by 2 ranks"):
        s.validate({"batch_size": 33})
    assert s.validate({"batch_size": 96, "micro_batch": 48}) == {"batch_size": 96,
                                                                "micro_batch": 48}
    assert s.view["batch_size"] == 64  # validation changes nothing


def plan(world, batch, micro, n=40):
    perm = torch.arange(n)
    return [list(_Slices(perm, 0, batch, r, world, False, micro).plan()) for r in range(world)]


def test_micro_batches_cover_the_global_batch_with_weights_summing_to_one():
    one = plan(1, 16, 4)
    two = plan(2, 16, 4)
    # Each step's samples are the same whatever the split: only who computes them differs.
    steps_one = [sorted(i for chunk, m in one[0][k:k + 4] for i in chunk)
                 for k in range(0, 8, 4)]
    steps_two = [sorted(i for r in range(2) for chunk, m in two[r][k:k + 2] for i in chunk)
                 for k in range(0, 4, 2)]
    assert steps_one == steps_two == [list(range(16)), list(range(16, 32))]
    # The last, partial step (8 samples) is split the same way and still weighs 1 in total.
    tail = [m for _, m in one[0] if m.take == 8]
    assert [m.weight for m in tail] == [0.5, 0.5] and {m.count for m in tail} == {2}
    for rank in two:
        for k in range(0, len(rank), 2):
            assert sum(m.weight for _, m in rank[k:k + 2]) == pytest.approx(1.0)
    assert Counter(i for r in two for c, _ in r for i in c) == Counter(range(40))
