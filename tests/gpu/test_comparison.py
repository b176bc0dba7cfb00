"""The GPU matrix's comparison can fail: it rejects what a device bug would produce.

Not marked ``gpu``: it needs no device and runs with the rest of the tests."""

from __future__ import annotations

import math

import pytest
import torch
from gpu_cells import RTOL_F64, Comparison, Outcome, compare_runs, rel_diff


def _theta():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(2, 650, generator=gen, dtype=torch.float64)


def test_rejects_a_1e8_relative_difference():
    theta = _theta()
    cmp = Comparison()
    cmp.close("theta_bar", theta * (1 + 1e-8), theta, RTOL_F64)
    with pytest.raises(AssertionError, match="theta_bar: 1e-08"):
        cmp.assert_ok()


def test_rejects_one_perturbed_coordinate():
    theta = _theta()
    bad = theta.clone()
    k = int(theta.abs().argmax())
    bad.view(-1)[k] *= 1 + 1e-8  # one coordinate, the largest, by 1e-8 of itself
    assert rel_diff(bad, theta) == pytest.approx(1e-8, rel=1e-3)
    cmp = Comparison()
    cmp.close("theta_bar", bad, theta, RTOL_F64)
    assert cmp.failures


def test_accepts_rounding_sized_differences():
    theta = _theta()
    cmp = Comparison()
    cmp.close("theta_bar", theta * (1 + 1e-13), theta, RTOL_F64)
    cmp.close("identical", theta, theta.clone(), RTOL_F64)
    cmp.close("zeros", torch.zeros(3), torch.zeros(3), RTOL_F64)
    cmp.assert_ok()
    assert 0 < cmp.worst < 1e-12


def test_rejects_shapes_nans_counts_and_the_wrong_device():
    assert rel_diff(torch.zeros(2, 3), torch.zeros(3, 2)) == math.inf
    assert rel_diff(torch.tensor([1.0, math.nan]), torch.tensor([1.0, 2.0])) == math.inf
    assert rel_diff(torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan])) == 0.0
    cmp = Comparison()
    cmp.exact("clients drawn", torch.tensor([0, 2]), torch.tensor([0, 3]))
    cmp.on_device("theta_bar", torch.zeros(1), torch.device("cuda"))
    assert len(cmp.failures) == 2
    with pytest.raises(AssertionError, match="nothing was compared"):
        Comparison().assert_ok()


def _outcome(theta, accuracy=0.9, clients=4):
    rows = [
        {
            "round": r,
            "accuracy": accuracy,
            "brier": 0.2,
            "ece": 0.05,
            "nll_mean": 0.4,
            "nll_sum": 144.0,
            "samples": 2 * r,
            "clients": clients,
            "grad_evals": 80 * r,
        }
        for r in (1, 2)
    ]
    return Outcome(theta, theta.unsqueeze(0), rows, None)


def test_compare_runs_catches_a_perturbed_run():
    theta = _theta()
    want = _outcome(theta)
    ok = Comparison()
    compare_runs(ok, _outcome(theta.clone()), want, "float64")
    ok.assert_ok()
    for bad in (
        _outcome(theta * (1 + 1e-8)),
        _outcome(theta, accuracy=0.9 * (1 + 1e-8)),
        _outcome(theta, clients=3),
    ):
        cmp = Comparison()
        compare_runs(cmp, bad, want, "float64")
        assert cmp.failures
    # float32: metrics within the stated bounds; a flip of 4 of 360 predictions is not
    cmp = Comparison()
    compare_runs(cmp, _outcome(theta, accuracy=0.9 + 4 / 360), want, "float32")
    assert [f for f in cmp.failures if "accuracy" in f]
