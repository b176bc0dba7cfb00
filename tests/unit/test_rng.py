"""Counter-based RNG: exact agreement with a reference, layout independence, moments."""

import math

import torch

from fedhmc.core import rng


def _ref_derive(key: int, *parts: int) -> int:
    m = (1 << 64) - 1
    k = key & m
    for p in parts:
        k = rng.mix_int(k ^ rng.mix_int((p + rng._GOLDEN) & m))
    return k


def test_derive_matches_unsigned_reference():
    for key, parts in [(0, (1,)), (12345, (3, 7)), (2**63 + 5, (2**40, 0, 9))]:
        got = int(rng.derive(key, *parts).item()) & ((1 << 64) - 1)
        assert got == _ref_derive(key, *parts)


def test_tensor_keys_match_scalar_keys():
    keys = rng.derive(7, torch.arange(5))
    for i in range(5):
        assert int(keys[i]) == int(rng.derive(7, i))


def test_draws_do_not_depend_on_draw_length_or_batch():
    keys = rng.derive(1, torch.arange(3))
    long = rng.normal(keys, 4, 50)
    short = rng.normal(keys[1:2], 4, 20)
    assert torch.equal(long[1:2, :20], short)
    u = rng.uniform(keys, 9, 33)
    assert torch.equal(u[:, :10], rng.uniform(keys, 9, 10))


def test_normal_moments_within_monte_carlo_error():
    n = 400_000
    z = rng.normal(rng.derive(42, 0), 0, n, torch.float64)
    # Standard errors of the mean, variance and fourth moment of N(0, 1).
    assert abs(float(z.mean())) < 5 * math.sqrt(1 / n)
    assert abs(float(z.var()) - 1) < 5 * math.sqrt(2 / n)
    assert abs(float((z**4).mean()) - 3) < 5 * math.sqrt(96 / n)
    u = rng.uniform(rng.derive(42, 1), 0, n)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / n)


def test_streams_are_uncorrelated():
    n = 200_000
    keys = rng.derive(3, torch.arange(4))
    z = rng.normal(keys, 0, n, torch.float64)
    corr = torch.corrcoef(z)
    off = corr[~torch.eye(4, dtype=torch.bool)]
    assert float(off.abs().max()) < 5 / math.sqrt(n)
    z2 = rng.normal(keys[:1], 1, n, torch.float64)
    assert abs(float(torch.corrcoef(torch.stack([z[0], z2[0]]))[0, 1])) < 5 / math.sqrt(n)


def test_uniform_block_rows_are_the_single_draws():
    keys = rng.derive(7, torch.arange(6).view(2, 3))
    block = rng.uniform_block(keys, 5, 4, 9)
    assert block.shape == (2, 3, 4, 9)
    for j in range(4):
        assert torch.equal(block[:, :, j], rng.uniform(keys, 5 + j, 9))


def test_every_stream_id_is_unique():
    from fedhmc.core import streams

    ids = streams.table()
    assert len(ids) >= 15
    assert len(set(ids.values())) == len(ids), ids
