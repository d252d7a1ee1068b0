"""The global batch means the same on any number of ranks: 1 rank x 4 micro-batches, 2 ranks x
2 micro-batches and plain full-batch SGD on the same samples give the same loss curve."""

import numpy as np
import torch
from helpers import JOBS
from torch import nn

import hpinteract as hpi
from hpinteract.trainer.loader import HpLoader


def reference_curve():
    """Plain PyTorch on one process: mean-loss SGD over the loader's permutation."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(256, 8, generator=g)
    Y = X @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(256, 1, generator=g)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    curve = []
    for epoch in range(2):
        perm = HpLoader.permutation(type("L", (), {"dataset": X, "shuffle": True,
                                                   "seed": 3})(), epoch)
        for s in range(0, 256, 32):
            idx = perm[s:s + 32]
            opt.zero_grad()
            nn.functional.mse_loss(net(X[idx]), Y[idx]).backward()
            opt.step()
            with torch.no_grad():
                curve.append(nn.functional.mse_loss(net(X), Y).item())
    return np.array(curve)


def test_one_rank_and_two_ranks_give_the_same_loss_curve(tmp_path):
    one = hpi.launch(JOBS / "equiv.py", nproc=1, hparams={"micro_batch": 8}, cwd=tmp_path)
    two = hpi.launch(JOBS / "equiv.py", nproc=2, hparams={"micro_batch": 8}, cwd=tmp_path)
    assert one.wait(120).value == "finished", one.error
    assert two.wait(120).value == "finished", two.error
    a = one.metrics()["full_loss"].to_numpy()
    b = two.metrics()["full_loss"].to_numpy()
    assert len(a) == len(b) == 16
    np.testing.assert_allclose(a, b, rtol=1e-5)
    np.testing.assert_allclose(a, reference_curve(), rtol=1e-5)
    assert a[-1] < a[0] / 2  # it learned: the comparison is not of two flat lines
    assert one.status()["plan"] == {"micro_batch": 8, "accumulation": 4}
    assert two.status()["plan"] == {"micro_batch": 8, "accumulation": 2}
