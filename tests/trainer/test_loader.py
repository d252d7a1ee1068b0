"""HpLoader on one process, with the ranks simulated: the epoch semantics of a live batch."""

import contextlib
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from hpinteract.protocol.errors import ConfigError
from hpinteract.protocol.hparams import build_specs
from hpinteract.trainer.loader import HpLoader
from hpinteract.trainer.store import HParamStore


class Indexed(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))


def fake_run(rank, world, batch, start=None):
    """What HpLoader uses of a Run; ``start`` is a resumed job's (epoch, position)."""
    store = HParamStore(build_specs({"batch_size": batch}))
    return SimpleNamespace(rank=rank, world_size=world, epoch=0, should_stop=False,
                           store=store, hp=store.view, _batch_started=lambda where=None: None,
                           _loader_start=lambda size: start,
                           _watch=SimpleNamespace(between_steps=contextlib.nullcontext))


def epoch_of(loader, run, change_at=None, new_batch=None):
    out = []
    for k, batch in enumerate(loader):
        out.append(batch.tolist())
        if k + 1 == change_at:
            run.store.apply({"batch_size": new_batch}, k + 1)
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_change_mid_epoch_neither_repeats_nor_skips(workers):
    n, world = 100, 2
    seen: Counter = Counter()
    sizes = []
    for rank in range(world):
        run = fake_run(rank, world, 8)
        loader = HpLoader(run, Indexed(n), seed=3, num_workers=workers)
        batches = epoch_of(loader, run, change_at=4, new_batch=20)
        seen.update(i for b in batches for i in b)
        sizes.append([len(b) for b in batches])
    # 4 steps of 8 (32 samples), then 3 of 20, then the 8 left over, shared 4 + 4
    assert sizes[0] == sizes[1] == [4, 4, 4, 4, 10, 10, 10, 4]
    assert set(seen.values()) == {1}
    assert len(seen) == n


def test_the_remainder_is_shared_equally_or_dropped():
    for drop_last, expect in [(False, [5, 5, 5, 1]), (True, [5, 5, 5])]:
        run = fake_run(0, 2, 10)
        loader = HpLoader(run, Indexed(33), shuffle=False, drop_last=drop_last)
        assert [len(b) for b in loader] == expect
        assert len(HpLoader(run, Indexed(33), drop_last=drop_last)) == len(expect)


def test_same_permutation_on_every_rank_and_new_one_each_epoch():
    r0, r1 = fake_run(0, 2, 10), fake_run(1, 2, 10)
    l0, l1 = HpLoader(r0, Indexed(40), seed=7), HpLoader(r1, Indexed(40), seed=7)
    first = [b.tolist() for b in l0]
    e0 = [i for b in first for i in b] + [i for b in l1 for i in b.tolist()]
    assert sorted(e0) == list(range(40))
    # A plain `for epoch in range(n)` loop: each pass is a new epoch, reshuffled.
    second = [b.tolist() for b in l0]
    assert second != first and sorted(map(len, second)) == sorted(map(len, first))
    # Under run.epochs() the run's epoch picks the permutation.
    r0.epoch = 5
    assert [i for b in l0 for i in b.tolist()][:5] == l0.permutation(5)[:5].tolist()


def test_stop_ends_the_epoch():
    run = fake_run(0, 1, 4)
    loader = HpLoader(run, Indexed(40))
    got = []
    for b in loader:
        got.append(b)
        run.should_stop = True
    assert len(got) == 1


def test_dataloader_options_pass_through_and_conflicts_are_explained():
    run = fake_run(0, 1, 4)
    loader = HpLoader(run, Indexed(8), shuffle=False, collate_fn=lambda xs: sum(xs))
    assert list(loader) == [0 + 1 + 2 + 3, 4 + 5 + 6 + 7]
    with pytest.raises(ConfigError, match="batch_size"):
        HpLoader(run, Indexed(8), batch_size=4)
    with pytest.raises(ConfigError, match="map-style"):
        HpLoader(run, Stream())


def test_a_resumed_loader_continues_mid_epoch_with_the_same_samples():
    whole = [fake_run(r, 2, 8) for r in (0, 1)]
    full = [epoch_of(HpLoader(run, Indexed(64), seed=3), run) for run in whole]
    resumed = [fake_run(r, 2, 8, start=(0, 24)) for r in (0, 1)]
    rest = [epoch_of(HpLoader(run, Indexed(64), seed=3), run) for run in resumed]
    for r in (0, 1):  # 24 samples = 3 steps of 8 were done: the rest is the same
        assert rest[r] == full[r][3:]
    assert resumed[0].epoch == 0
