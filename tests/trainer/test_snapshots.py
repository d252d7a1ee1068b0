"""The snapshot ring that DivergenceGuard's rollback restores from."""

import torch

from hpinteract.trainer.snapshots import Snapshots


def _model():
    torch.manual_seed(0)
    m = torch.nn.Linear(2, 1)
    return m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def test_nothing_is_kept_until_a_guard_asks():
    m, opt = _model()
    snaps = Snapshots()
    snaps.maybe_take(0, m, opt, None)
    assert snaps.steps == []


def test_the_ring_reaches_back_exponentially_with_at_most_keep_copies():
    m, opt = _model()
    snaps = Snapshots(keep=4)
    snaps.configure(5)
    for step in range(0, 200, 1):
        snaps.maybe_take(step, m, opt, None)
        assert len(snaps.steps) <= 4
    # 40 snapshots (numbers 0..39, every 5 steps): newest multiples of 1, 2, 4, 8.
    assert snaps.steps == [160, 180, 190, 195]


def test_a_late_rollback_still_finds_a_state_from_before_the_divergence():
    m, opt = _model()
    snaps = Snapshots()
    snaps.configure(5)
    good = {k: v.clone() for k, v in m.state_dict().items()}
    for step in range(0, 60):  # the last good step is 20; the decision comes 40 steps late
        if step == 21:
            with torch.no_grad():
                m.weight.fill_(1e6)
        snaps.maybe_take(step, m, opt, None)
    assert snaps.steps == [0, 40, 50, 55]  # a plain ring of the newest 5 would start at 35
    restored = snaps.restore(20, m, opt, None)
    assert restored is not None and restored <= 20
    assert torch.equal(m.weight, good["weight"])

def test_restore_loads_model_and_optimizer_and_drops_the_diverged_snapshots():
    m, opt = _model()
    snaps = Snapshots()
    snaps.configure(1)
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    snaps.maybe_take(3, m, opt, None)
    for step in (4, 5, 6):
        m(torch.ones(1, 2)).sum().backward()
        opt.step()
        snaps.maybe_take(step, m, opt, None)
    assert snaps.restore(3, m, opt, None) == 3
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert snaps.steps == [3]
    assert snaps.restore(2, m, opt, None) is None  # nothing that old: nothing loaded


def test_switching_the_guard_off_frees_the_copies():
    m, opt = _model()
    snaps = Snapshots()
    snaps.configure(1)
    snaps.maybe_take(0, m, opt, None)
    snaps.configure(0)
    assert snaps.steps == []
