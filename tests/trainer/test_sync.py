"""The sync points' spacing (rank 0's side of ``StepSync``, in one gloo process): fast
steps are spaced to the budget, capped by the latency bound, and a sync point that carried
commands is followed by one at the very next step, whatever the spacing was."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from hpinteract.trainer.sync import StepSync


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield None
    dist.destroy_process_group()


def boundaries_until_due(sync: StepSync) -> int:
    n = 1
    while not sync.due():
        n += 1
    return n


def test_fast_steps_are_spaced_and_a_change_brings_the_next_sync_to_the_next_step(group):
    sync = StepSync(None, 0, budget=0.01, max_latency_s=0.1)
    assert sync.due()  # the very first boundary
    for _ in range(31):
        sync._sync_costs.append(0.0002)  # 0.2 ms a broadcast, as measured on 2 cores
    sync.observe_step(0.004)  # 4 ms steps: 0.2 ms is 5 % of one, the budget is 1 %
    assert sync.exchange(None) == []
    assert sync.interval == 5 and boundaries_until_due(sync) == 5
    # A change (here the toy job's per-step sleep) that makes the steps 750x slower: the
    # next sync point is the next step, not five of the new steps later.
    wire = [{"op": "set", "id": "c1", "values": {"sleep": 3.0}}]
    assert sync.exchange(wire) == wire
    assert sync.interval == 1 and boundaries_until_due(sync) == 1
    sync.observe_step(3.0)
    assert sync.exchange(None) == []
    assert sync.interval == 1  # 3 s steps are over the 0.1 s latency bound: every step


def test_the_spacing_never_passes_the_latency_bound(group):
    sync = StepSync(None, 0, budget=0.01, max_latency_s=0.1)
    for _ in range(31):
        sync._sync_costs.append(0.01)  # a slow broadcast would want 1,000 steps apart
    sync.observe_step(0.001)
    sync.exchange(None)
    assert sync.interval == 100  # 0.1 s of 1 ms steps
    assert sync.seconds_between() == pytest.approx(0.1)
