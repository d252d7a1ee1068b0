"""Per-rank step and data-wait times: the means since the last gather, and the straggler
ratio, on one rank and across two real gloo processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from hpinteract.trainer.rank_times import RankTimes


def test_one_rank_reports_its_means_and_starts_over_after_a_gather():
    t = RankTimes(None, world=1, rank=0)
    assert not t.due(0, 10) and t.due(10, 10) and not t.due(10, 0)
    t.add(0.010, 0.002)
    t.add(0.030, 0.004)
    out = t.gather(10)
    assert out["step_time_r0"] == pytest.approx(0.020)
    assert out["data_time_r0"] == pytest.approx(0.003)
    assert out["straggler"] == 1.0
    assert t.last == 10 and not t.due(15, 10) and t.due(20, 10)
    t.add(0.5, 0.0)  # only what came after the gather
    assert t.gather(20)["step_time_r0"] == pytest.approx(0.5)


def test_a_gather_with_no_steps_reports_zeros_not_a_division_by_zero():
    out = RankTimes(None, world=1, rank=0).gather(5)
    assert out == {"step_time_r0": 0.0, "data_time_r0": 0.0, "straggler": 1.0}


def _rank(rank: int, store: str, out: Any) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    t = RankTimes(None, world=2, rank=rank)
    for _ in range(4):  # rank 1 is three times as slow, and waits for data
        t.add(0.01 * (1 + 2 * rank), 0.005 * rank)
    out.put((rank, t.gather(4)))
    dist.destroy_process_group()


def test_two_ranks_see_each_others_times_and_the_straggler(tmp_path: Path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store = str(tmp_path / "store")
    procs = [ctx.Process(target=_rank, args=(r, store, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert got[0] == got[1]  # every rank has the whole picture
    assert got[0]["step_time_r0"] == pytest.approx(0.01)
    assert got[0]["step_time_r1"] == pytest.approx(0.03)
    assert got[0]["data_time_r1"] == pytest.approx(0.005)
    # The slowest over the (lower) median: with two ranks, the slowest over the fastest.
    assert got[0]["straggler"] == pytest.approx(3.0)
