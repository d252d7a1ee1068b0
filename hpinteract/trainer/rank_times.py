"""Per-rank step and data-wait times, so that a straggler shows.

Runs in: every rank's training thread. ``monitor_ranks`` (every N steps, 0 for off) is a
hyper-parameter, so every rank gathers at the same sync point: the collective always
matches. Rank 0 publishes the result with its next step record.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class RankTimes:
    """Mean step and data-wait time of every rank since the last gather, so a straggler
    shows. Gathered at a sync point (one small all-reduce every ``monitor_ranks`` steps)."""

    def __init__(self, group: Any, world: int, rank: int) -> None:
        self.group, self.world, self.rank = group, world, rank
        self._step = self._data = 0.0
        self._n = 0
        self.last = 0

    def add(self, step_time: float, data_time: float) -> None:
        self._step += step_time
        self._data += data_time
        self._n += 1

    def due(self, step: int, every: int) -> bool:
        return every > 0 and step - self.last >= every

    def gather(self, step: int) -> dict[str, float]:
        t = torch.zeros(2 * self.world, dtype=torch.float64)
        n = max(self._n, 1)
        t[2 * self.rank], t[2 * self.rank + 1] = self._step / n, self._data / n
        self._step = self._data = 0.0
        self._n, self.last = 0, step
        if self.world > 1:
            dist.all_reduce(t, group=self.group)
        values = t.tolist()
        out = {}
        for r in range(self.world):
            out[f"step_time_r{r}"], out[f"data_time_r{r}"] = values[2 * r], values[2 * r + 1]
        # The slowest rank's time over the median's, the lower middle for an even count:
        # with two ranks the upper middle is the slowest itself, and a straggler among two
        # (the commonest job) would always read 1.
        steps = sorted(values[0::2])
        median = steps[(len(steps) - 1) // 2]
        out["straggler"] = steps[-1] / median if median > 0 else 1.0
        return out
