"""Metrics against hand-computed values, scikit-learn and scipy."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance
from sklearn.metrics import log_loss

from fedhmc.analysis.metrics import (
    BMAPredictive,
    accuracy,
    brier,
    ece,
    gaussian_w2,
    gaussian_w2_diag,
    marginal_error,
    nll,
    predictive_metrics,
)

P = torch.tensor(
    [[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.25, 0.5, 0.25], [0.9, 0.05, 0.05]], dtype=torch.float64
)
Y = torch.tensor([0, 2, 0, 1])


def test_hand_computed_values():
    assert accuracy(P, Y) == 0.5  # rows 0 and 1 right
    rows = [
        (0.3**2 + 0.2**2 + 0.1**2),
        (0.1**2 + 0.3**2 + 0.4**2),
        (0.75**2 + 0.5**2 + 0.25**2),
        (0.9**2 + 0.95**2 + 0.05**2),
    ]
    assert brier(P, Y) == pytest.approx(sum(rows) / 4)
    nll_mean, nll_sum = nll(P.log(), Y)
    want = -(math.log(0.7) + math.log(0.6) + math.log(0.25) + math.log(0.05))
    assert nll_sum == pytest.approx(want) and nll_mean == pytest.approx(want / 4)
    # ECE, 15 bins of width 1/15: conf 0.7 → bin 10 (0.667, 0.733], correct;
    # 0.6 → bin 8 (0.533, 0.6], correct; 0.5 → bin 7 (0.467, 0.533], wrong;
    # 0.9 → bin 13 (0.867, 0.933], wrong.
    want_ece = (abs(1 - 0.7) + abs(1 - 0.6) + abs(0 - 0.5) + abs(0 - 0.9)) / 4
    assert ece(P, Y) == pytest.approx(want_ece)


def test_ece_pools_a_bin():
    p = torch.tensor([[0.81, 0.19], [0.84, 0.16], [0.3, 0.7]], dtype=torch.float64)
    y = torch.tensor([0, 1, 1])
    # 0.81 and 0.84 share bin (0.8, 0.867]: acc 0.5, conf 0.825. 0.7 in (0.667, 0.733]: acc 1.
    want = (2 / 3) * abs(0.5 - 0.825) + (1 / 3) * abs(1 - 0.7)
    assert ece(p, y) == pytest.approx(want)


def test_nll_and_brier_agree_with_sklearn_and_a_direct_formula():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(500, 7, generator=gen, dtype=torch.float64)
    lp = torch.log_softmax(logits, -1)
    y = torch.randint(0, 7, (500,), generator=gen)
    m = predictive_metrics(lp, y)
    probs = lp.exp().numpy()
    assert m["nll_mean"] == pytest.approx(log_loss(y.numpy(), probs, labels=range(7)))
    assert m["nll_sum"] == pytest.approx(500 * m["nll_mean"])
    onehot = np.eye(7)[y.numpy()]
    assert m["brier"] == pytest.approx(((probs - onehot) ** 2).sum(1).mean())


def test_streaming_bma_equals_the_direct_mean():
    gen = torch.Generator().manual_seed(1)
    samples = [torch.log_softmax(torch.randn(3, 20, 4, generator=gen), -1) for _ in range(5)]
    bma = BMAPredictive()
    for s in samples:
        got = bma.update(s)
    direct = torch.cat(samples).to(torch.float64).exp().mean(0).log()
    torch.testing.assert_close(got, direct)
    assert bma.count == 15


def test_bma_does_not_underflow():
    lp = torch.full((1, 2, 3), -2000.0, dtype=torch.float64)
    lp[..., 0] = 0.0
    bma = BMAPredictive()
    bma.update(lp)
    out = bma.update(lp)
    assert torch.isfinite(out).all() and float(out[0, 1]) == pytest.approx(-2000.0)


def test_marginal_error_matches_scipy():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(300, 3, generator=gen, dtype=torch.float64)
    b = 1.5 * torch.randn(170, 3, generator=gen, dtype=torch.float64) + 0.3
    want = np.mean([wasserstein_distance(a[:, i], b[:, i]) for i in range(3)])
    assert marginal_error(a, b) == pytest.approx(want, rel=1e-10)
    # A shift by c moves every marginal by exactly c.
    assert marginal_error(a, a + 0.25) == pytest.approx(0.25)


def test_marginal_error_batched_is_each_entry_alone():
    """Leading batch dimensions: each entry's ME against the one reference, as alone."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(2, 3, 7, 4, generator=gen, dtype=torch.float64)
    b = torch.randn(13, 4, generator=gen, dtype=torch.float64)
    me = marginal_error(a, b)
    assert me.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            want = np.mean([wasserstein_distance(a[i, j, :, k], b[:, k]) for k in range(4)])
            assert float(me[i, j]) == pytest.approx(want, rel=1e-12)


def test_gaussian_w2_closed_forms():
    # 1-D: W₂² = (m1 − m2)² + (s1 − s2)².
    assert gaussian_w2([1.0], [[4.0]], [3.0], [[1.0]]) == pytest.approx(math.sqrt(4 + 1))
    # Commuting covariances: Σ (√λ1 − √λ2)².
    c1, c2 = torch.diag(torch.tensor([1.0, 9.0])), torch.diag(torch.tensor([4.0, 1.0]))
    assert gaussian_w2([0, 0], c1, [0, 0], c2) == pytest.approx(math.sqrt(1 + 4))
    # Non-commuting: invariant to a common rotation.
    r = torch.tensor(
        [[math.cos(0.3), -math.sin(0.3)], [math.sin(0.3), math.cos(0.3)]], dtype=torch.float64
    )
    a = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    b = torch.tensor([[1.0, -0.2], [-0.2, 3.0]], dtype=torch.float64)
    assert gaussian_w2([1, 2], a, [0, 1], b) == pytest.approx(
        gaussian_w2(
            r @ torch.tensor([1.0, 2], dtype=torch.float64),
            r @ a @ r.T,
            r @ torch.tensor([0.0, 1], dtype=torch.float64),
            r @ b @ r.T,
        )
    )
    assert gaussian_w2([1, 2], a, [1, 2], a) == pytest.approx(0.0, abs=1e-7)


def test_gaussian_w2_diag():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    # per-coordinate means (2, 3), unbiased sd √2.
    w2, me = gaussian_w2_diag(x, 1.0, 1.0)
    assert me == pytest.approx(math.sqrt(1 + 4))
    assert w2 == pytest.approx(math.sqrt(1 + 4 + 2 * (math.sqrt(2) - 1) ** 2))
    assert math.isnan(gaussian_w2_diag(x[:1], 1.0, 1.0)[0])


def _ece_on_the_device(probs, labels, bins=15):
    """ECE as fedhmc computed it before: the bins summed on the probabilities' device
    with index_add_ (atomic, in a varying order, on a GPU)."""
    p = probs.to(torch.float64)
    conf, pred = p.max(-1)
    correct = (pred == labels.to(p.device)).to(torch.float64)
    idx = (torch.ceil(conf * bins).long() - 1).clamp_(0, bins - 1)
    acc_sum = p.new_zeros(bins).index_add_(0, idx, correct)
    conf_sum = p.new_zeros(bins).index_add_(0, idx, conf)
    return float((acc_sum - conf_sum).abs().sum() / p.shape[0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("m, c, bins", [(1, 2, 15), (1000, 10, 15), (10_000, 3, 7), (257, 2, 1)])
def test_ece_summed_in_order_on_the_cpu_equals_the_device_sums_exactly(m, c, bins, dtype):
    """ECE's bins are summed on the CPU in the test points' order (no atomics): on the CPU
    that is exactly the index_add_ it replaced, bit for bit, for every size and bin count,
    with confidences on the bins' edges too."""
    gen = torch.Generator().manual_seed(m + c)
    probs = torch.softmax(3 * torch.randn(m, c, generator=gen, dtype=torch.float64), -1)
    probs[: m // 4] = torch.full((c,), 1.0 / c, dtype=torch.float64)  # on an edge for some
    probs = probs.to(dtype)
    labels = torch.randint(0, c, (m,), generator=gen)
    assert ece(probs, labels, bins) == _ece_on_the_device(probs, labels, bins)
