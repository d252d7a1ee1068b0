"""A data loader whose global batch is a live hyper-parameter.

Runs in: every rank's training thread (plus the DataLoader's own worker processes).
Semantics: one permutation per epoch, seeded by (seed, epoch) and so the same on every
rank; each step takes the next ``batch_size`` samples of it and gives rank r its slice of
``batch_size / world_size``, as one batch or (with ``micro_batch``) as micro-batches.
When batch_size changes mid-epoch the loader continues the same permutation from the first
sample not yet taken: no sample repeats and none is skipped. Prefetched batches of the old
size are discarded, never consumed, because the underlying DataLoader iterator is rebuilt
at the position actually reached.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from ..protocol.errors import ConfigError
from .batching import micro_chunks, plan_of

if TYPE_CHECKING:
    from .run import Run

_REJECTED = ("batch_size", "sampler", "batch_sampler")


class _Slices(Sampler[list[int]]):  # type: ignore[misc]  # torch is untyped for mypy here
    """This rank's micro-batches: step k takes perm[start + k*B + r*b : ... + b] and splits
    it into micro-batches of ``micro`` samples (one micro-batch without accumulation)."""

    def __init__(
        self, perm: torch.Tensor, start: int, global_batch: int, rank: int, world: int,
        drop_last: bool, micro: int | None = None,
    ) -> None:
        self.perm, self.start, self.B = perm, start, global_batch
        self.rank, self.world, self.drop_last = rank, world, drop_last
        self.micro = micro

    def plan(self) -> Iterator[tuple[list[int], Micro]]:
        n = len(self.perm)
        for s in range(self.start, n, self.B):
            take = min(self.B, n - s)
            if take < self.B and self.drop_last:
                return
            b = take // self.world  # equal shares, so no rank waits in a collective alone
            if b == 0:
                return
            lo = s + self.rank * b
            local = self.perm[lo : lo + b].tolist()
            chunks = micro_chunks(local, self.micro or b)
            for i, chunk in enumerate(chunks):
                yield chunk, Micro(i, len(chunks), len(chunk) / b, take)

    def __iter__(self) -> Iterator[list[int]]:
        return (chunk for chunk, _ in self.plan())

    def __len__(self) -> int:
        return steps_in(len(self.perm) - self.start, self.B, self.world, self.drop_last)


@dataclass(frozen=True, slots=True)
class Micro:
    """Where a micro-batch sits in its step: index, count, weight (its share of the rank's
    samples, by which its mean loss is scaled) and the step's global sample count."""

    index: int
    count: int
    weight: float
    take: int


ONE = Micro(0, 1, 1.0, 0)


def steps_in(remaining: int, global_batch: int, world: int, drop_last: bool) -> int:
    full, rest = divmod(max(remaining, 0), global_batch)
    return full + (1 if rest // world and not drop_last else 0)


class HpLoader:
    """Iterate it once per epoch, inside ``for epoch in run.epochs(n)``."""

    def __init__(
        self, run: Run, dataset: Any, *, shuffle: bool = True, seed: int = 0,
        drop_last: bool = False, **options: Any,
    ) -> None:
        for bad in _REJECTED:
            if bad in options:
                raise ConfigError(
                    f"run.dataloader() takes no {bad!r}: the batch comes from the batch_size "
                    "hyper-parameter (declare it in hpi.init(hparams=...))"
                )
        if isinstance(dataset, IterableDataset) or not isinstance(dataset, Sized):
            raise ConfigError("run.dataloader() needs a map-style dataset with __len__")
        self.run, self.dataset = run, dataset
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.options = options
        self.size = len(dataset)
        self.position = 0  # samples of the current epoch's permutation already taken
        self.epoch = -1  # the epoch whose permutation is in use
        self._run_epoch = -1
        start = run._loader_start(self.size)
        if start is not None:  # a resumed job: its first loader continues mid-epoch
            self.epoch, self.position = start
            self._run_epoch = run.epoch = start[0]

    def __len__(self) -> int:
        """Steps left in this epoch at the current batch size (a full epoch if none started)."""
        start = self.position if self.epoch == self.run.epoch else 0
        return steps_in(len(self.dataset) - start, self._batch(), self.run.world_size,
                        self.drop_last)

    def _batch(self) -> int:
        return int(self.run.hp["batch_size"])

    def permutation(self, epoch: int) -> torch.Tensor:
        n = len(self.dataset)
        if not self.shuffle:
            return torch.arange(n)
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(n, generator=g)

    def __iter__(self) -> Iterator[Any]:
        run = self.run
        if self._run_epoch != run.epoch:  # a new epoch of run.epochs()
            self._run_epoch = run.epoch
            self.epoch, self.position = run.epoch, 0
        elif self.position >= self.size:  # a plain `for epoch in range(n)` loop: count here
            self.epoch, self.position = self.epoch + 1, 0
        perm = self.permutation(self.epoch)
        n = len(perm)
        versions: tuple[int, ...] = ()
        it: Iterator[Any] | None = None
        plan: Iterator[tuple[list[int], Micro]] = iter(())
        while self.position < n and not run.should_stop:
            now = (run.store.versions.get("batch_size", 0),
                   run.store.versions.get("micro_batch", 0))
            fresh = it is None or now != versions
            if fresh:  # only ever between steps (a sync point)
                versions = now
                micro, _ = plan_of(run.hp, run.world_size)
                sampler = _Slices(perm, self.position, self._batch(), run.rank,
                                  run.world_size, self.drop_last,
                                  micro if "micro_batch" in run.hp else None)
                if len(sampler) == 0:
                    break
                it = iter(DataLoader(self.dataset, batch_sampler=sampler, **self.options))
                plan = sampler.plan()
            assert it is not None
            try:
                if fresh:  # a loader's start (its worker processes) is no hang
                    with run._watch.between_steps():
                        batch = next(it)
                else:
                    batch = next(it)
            except StopIteration:
                break
            _, where = next(plan)
            if where.index == where.count - 1:
                self.position = min(n, self.position + where.take)
            run._batch_started(where)
            yield batch
        self.position = n  # the epoch is over (or stopped): the next iteration starts anew
