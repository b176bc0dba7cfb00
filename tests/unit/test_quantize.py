"""The QSGD quantizer (fedhmc.core.quantize): unbiased, within its error bound, on its grid,
keyed draws reproducible, and its bit count."""

from __future__ import annotations

import math

import pytest
import torch

from fedhmc.core import quantize as q
from fedhmc.core import rng

DIM = 20
DRAWS = 40_000
LEVELS = (1, 2, 4, 16)


def _fixed_x() -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(DIM, generator=g, dtype=torch.float64)


def _many(x: torch.Tensor, levels: float, seed: int) -> torch.Tensor:
    """DRAWS independent quantizations of x, (DRAWS, d), in one batched call."""
    g = torch.Generator().manual_seed(seed)
    batch = x.expand(DRAWS, -1)
    return q.quantize(batch, levels, torch.rand(batch.shape, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("levels", LEVELS)
def test_unbiased(levels):
    # Each coordinate of the mean of DRAWS independent quantizations is, by the central
    # limit theorem, close to normal around E[C_s(x)_i] with standard error se_i = (the
    # sample standard deviation) / √DRAWS. If the quantizer is unbiased, |mean_i − x_i| >
    # 5 se_i has probability about 6e-7 per coordinate, so about 5e-5 over the 80
    # coordinates of this test: a failure means a bias, not bad luck. A bias of even 1% of
    # the level spacing ‖x‖/s would be far beyond 5 se at this number of draws. A
    # coordinate that lies exactly on a level never varies (se = 0); the tiny absolute slack
    # covers its rounding.
    x = _fixed_x()
    out = _many(x, levels, seed=levels)
    mean = out.mean(0)
    se = out.std(0) / math.sqrt(DRAWS)
    assert torch.all((mean - x).abs() <= 5 * se + 1e-12), (mean - x).abs() / se


@pytest.mark.parametrize("levels", LEVELS)
def test_error_within_omega_bound(levels):
    # E‖C_s(x) − x‖² ≤ ω_s ‖x‖²: the empirical mean of the squared error, plus five of its
    # standard errors (the same reasoning as above), must not exceed the bound; and a finite
    # number of levels always loses something on a generic x.
    x = _fixed_x()
    err = ((_many(x, levels, seed=100 + levels) - x) ** 2).sum(-1)
    mse, se = err.mean(), err.std() / math.sqrt(DRAWS)
    bound = q.omega(levels, DIM) * (x**2).sum()
    assert mse - 5 * se <= bound
    assert mse > 0


@pytest.mark.parametrize("levels", LEVELS)
def test_values_on_the_grid(levels):
    x = _fixed_x()
    out = _many(x, levels, seed=7)[:500]
    norm = torch.linalg.vector_norm(x)
    k = out * levels / norm
    assert torch.allclose(k, k.round(), atol=1e-9)
    assert torch.all(k.round().abs() <= levels)
    # Each coordinate keeps x's sign or becomes zero.
    assert torch.all((torch.sign(out) == torch.sign(x)) | (out == 0))
    # Rounded to one of the two neighbouring levels.
    low = torch.floor(x.abs() * levels / norm)
    assert torch.all((k.round().abs() - low).abs() <= 1)


def test_infinite_levels_is_identity():
    x = _fixed_x()
    u = torch.rand(x.shape, dtype=torch.float64)
    assert torch.equal(q.quantize(x, math.inf, u), x)
    assert torch.equal(q.quantize_keyed(x, math.inf, rng.derive(1)), x)
    assert q.omega(math.inf, DIM) == 0.0


def test_zero_rows_stay_zero():
    x = torch.zeros(3, 5, DIM)
    x[1, 2] = torch.arange(DIM, dtype=torch.float32)
    out = q.quantize(x, 4, torch.rand(x.shape))
    assert torch.isfinite(out).all()
    assert torch.equal(out[0], torch.zeros(5, DIM))
    assert torch.equal(out[1, :2], torch.zeros(2, DIM))
    assert out[1, 2].abs().sum() > 0


def test_batch_dims_match_row_by_row():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, DIM, generator=g)
    u = torch.rand(x.shape, generator=g)
    out = q.quantize(x, 2, u)
    assert out.shape == x.shape and out.dtype == x.dtype
    for i in range(4):
        for j in range(3):
            assert torch.equal(out[i, j], q.quantize(x[i, j], 2, u[i, j]))


def test_half_precision_keeps_dtype():
    x = _fixed_x().to(torch.bfloat16)
    out = q.quantize(x, 4, torch.rand(x.shape))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_keyed_is_reproducible_and_key_dependent(monkeypatch):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 4, DIM, generator=g, dtype=torch.float64)
    keys = rng.derive(99, torch.arange(24).reshape(6, 4))
    a = q.quantize_keyed(x, 2, keys)
    assert torch.equal(a, q.quantize_keyed(x, 2, keys))
    assert torch.equal(a, q.quantize(x, 2, rng.uniform(keys, 0, DIM)))
    # Other keys (or another draw index) round differently.
    assert not torch.equal(a, q.quantize_keyed(x, 2, rng.derive(100, torch.arange(24)).view(6, 4)))
    assert not torch.equal(a, q.quantize_keyed(x, 2, keys, index=1))
    # The device path (int64 tensor hashing) draws the same bits as the CPU's NumPy path.
    monkeypatch.setattr(rng, "_TENSOR_PATH_ON_CPU", True)
    assert torch.equal(a, q.quantize_keyed(x, 2, keys))


def test_keyed_rows_are_independent_of_the_batch():
    x = _fixed_x().expand(3, -1)
    keys = rng.derive(7, torch.arange(3))
    batched = q.quantize_keyed(x, 4, keys)
    for r in range(3):
        assert torch.equal(batched[r], q.quantize_keyed(x[r], 4, keys[r]))


def test_bad_arguments_are_refused():
    x = _fixed_x()
    for levels in (0, 0.5, 2.5, -1, math.nan):
        with pytest.raises(ValueError, match="levels"):
            q.quantize(x, levels, torch.rand(DIM))
    with pytest.raises(ValueError, match="uniforms"):
        q.quantize(x, 2, torch.rand(DIM + 1))
    with pytest.raises(ValueError, match="keys"):
        q.quantize_keyed(x.expand(2, -1), 2, rng.derive(1, torch.arange(3)))


def test_omega():
    assert q.omega(1, 16) == 4.0  # min(16, 4)
    assert q.omega(16, 16) == pytest.approx(1 / 16)  # min(1/16, 1/4)
    assert q.omega(4, 4) == 0.25  # min(0.25, 0.5)


def test_bits():
    # norm (32) + 20 × (sign + 1 level bit for {0, 1})
    assert q.bits(1, 20, 32) == 32 + 20 * 2
    assert q.bits(2, 20, 32) == 32 + 20 * 3  # levels {0, 1, 2}: 2 bits
    assert q.bits(3, 20, 32) == 32 + 20 * 3  # {0, …, 3}: 2 bits
    assert q.bits(4, 20, 32) == 32 + 20 * 4  # {0, …, 4}: 3 bits
    assert q.bits(16, 10, 64) == 64 + 10 * 6  # {0, …, 16}: 5 bits
    assert q.bits(255, 1, 32) == 32 + 9
    assert q.bits(math.inf, 20, 32) == 640
    for s in (1, 2, 3, 7, 8, 100, 1000):
        assert int(s).bit_length() == math.ceil(math.log2(s + 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_keyed_quantize_in_a_cuda_graph():
    x = _fixed_x().to("cuda").expand(8, -1).contiguous()
    keys = rng.derive(11, torch.arange(8, device="cuda"))
    expected = q.quantize_keyed(x.cpu(), 4, keys.cpu())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        q.quantize_keyed(x, 4, keys)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = q.quantize_keyed(x, 4, keys)
    graph.replay()
    torch.cuda.synchronize()
    # The same rounding as on the CPU (the norm may differ in its last bits).
    assert torch.allclose(out.cpu(), expected, rtol=1e-12, atol=0)
