"""Tests of fedhmc_datasets.partition: coverage, determinism, skew, and one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fedhmc_datasets.partition import (
    PARTITIONERS,
    format_partition_table,
    label_entropy,
    label_histogram,
    partition,
    plot_label_heatmap,
)

from fedhmc.errors import ConfigError, DataError

NUM_CLASSES = 10


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    rng = np.random.default_rng(123)
    return rng.permutation(np.repeat(np.arange(NUM_CLASSES), 200))  # n = 2000, balanced


def assert_covering(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0), "each part must be sorted, without repeats"
    allidx = np.concatenate(parts)
    assert len(allidx) == n, "every example exactly once"
    assert np.array_equal(np.sort(allidx), np.arange(n))


@pytest.mark.parametrize("method", PARTITIONERS)
def test_disjoint_and_covering(labels, method):
    parts = partition(labels, 10, method, seed=1)
    assert_covering(parts, len(labels), 10)


@pytest.mark.parametrize("method", PARTITIONERS)
def test_deterministic_by_seed(labels, method):
    a = partition(labels, 8, method, seed=5)
    b = partition(labels, 8, method, seed=5)
    c = partition(labels, 8, method, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_accepts_torch_labels(labels):
    a = partition(torch.from_numpy(labels), 4, "dirichlet", seed=0)
    b = partition(labels, 4, "dirichlet", seed=0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_iid_sizes_differ_by_at_most_one():
    y = np.zeros(1003, dtype=np.int64)
    sizes = [len(p) for p in partition(y, 10, "iid")]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003


def test_dirichlet_entropy_falls_with_alpha(labels):
    means = []
    for alpha in (100.0, 1.0, 0.1):
        ent = [
            label_entropy(labels, partition(labels, 10, "dirichlet", alpha=alpha, seed=s), 10)
            for s in range(3)
        ]
        means.append(float(np.mean(ent)))
    assert means[0] > means[1] > means[2], means
    assert means[0] > 0.95 * np.log2(NUM_CLASSES)  # nearly uniform at alpha = 100
    assert means[2] < 0.6 * np.log2(NUM_CLASSES)  # strongly skewed at alpha = 0.1


def test_dirichlet_min_size_met(labels):
    parts = partition(labels, 20, "dirichlet", alpha=0.1, min_size=20, seed=0)
    assert min(len(p) for p in parts) >= 20


def test_dirichlet_impossible_min_size_raises_instead_of_looping():
    y = np.repeat(np.arange(2), 15)  # 30 examples in 2 classes; 10 clients, each needs 3
    with pytest.raises(DataError, match=r"alpha=0.001.*larger alpha") as exc:
        partition(y, 10, "dirichlet", alpha=0.001, min_size=3, seed=0)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_shards_exactly_k_distinct_classes(labels, k):
    for n_clients in (5, 10, 7, 50):
        if n_clients * k < NUM_CLASSES:
            continue  # infeasible; covered by test_shards_impossible_raises
        parts = partition(labels, n_clients, "shards", classes_per_client=k, seed=n_clients)
        assert_covering(parts, len(labels), n_clients)
        hist = label_histogram(labels, parts, NUM_CLASSES)
        assert np.all((hist > 0).sum(axis=1) == k), hist


def test_shards_with_unbalanced_classes():
    rng = np.random.default_rng(0)
    y = rng.permutation(np.repeat(np.arange(4), [500, 30, 12, 3]))
    parts = partition(y, 6, "shards", classes_per_client=2, seed=0)
    assert_covering(parts, len(y), 6)
    assert np.all((label_histogram(y, parts, 4) > 0).sum(axis=1) == 2)


def test_shards_impossible_raises():
    y = np.repeat(np.arange(10), 5)
    with pytest.raises(DataError, match="cannot cover 10 classes"):
        partition(y, 3, "shards", classes_per_client=2)  # 6 shards < 10 classes
    y = np.array([0, 1, 1, 1, 1, 1, 1, 1])  # class 0 can reach one client only
    with pytest.raises(DataError, match="too few"):
        partition(y, 4, "shards", classes_per_client=2)


def test_quantity_sizes_vary_and_are_positive():
    y = np.repeat(np.arange(10), 100)
    sizes = np.array([len(p) for p in partition(y, 20, "quantity", sigma=1.0, seed=0)])
    assert sizes.min() >= 1 and sizes.sum() == 1000
    assert sizes.max() > 2 * sizes.min()
    big = np.array([len(p) for p in partition(y[:30], 30, "quantity", sigma=5.0, seed=0)])
    assert np.all(big == 1)
    for seed in range(5):  # heavy skew, few examples per client: still every client >= 1
        skewed = [len(p) for p in partition(y[:100], 50, "quantity", sigma=3.0, seed=seed)]
        assert min(skewed) >= 1 and sum(skewed) == 100
    even = [len(p) for p in partition(y, 10, "quantity", sigma=0.0)]
    assert max(even) - min(even) <= 1


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"num_clients": 0}, ConfigError, r"num_clients.*\(2000\), got 0"),
        ({"num_clients": 2001}, ConfigError, "got 2001"),
        ({"method": "bogus"}, ConfigError, r"'bogus'.*iid, dirichlet, shards, quantity"),
        ({"method": "dirichlet", "alpha": 0.0}, ConfigError, "alpha.*got 0.0"),
        ({"method": "dirichlet", "alpha": -1.0}, ConfigError, "alpha.*got -1.0"),
        ({"method": "dirichlet", "alpha": float("nan")}, ConfigError, "alpha.*got nan"),
        ({"method": "dirichlet", "alpha": float("inf")}, ConfigError, "alpha.*got inf"),
        ({"method": "shards", "classes_per_client": 0}, ConfigError, r"\(10\), got 0"),
        ({"method": "shards", "classes_per_client": 11}, ConfigError, r"\(10\), got 11"),
        ({"method": "quantity", "sigma": -0.5}, ConfigError, "sigma.*got -0.5"),
        ({"seed": -1}, ConfigError, "seed.*got -1"),
    ],
)
def test_bad_arguments_raise_one_line(labels, kwargs, error, pattern):
    args = {"num_clients": 4, **kwargs}
    with pytest.raises(error, match=pattern) as exc:
        partition(labels, **args)
    assert "\n" not in str(exc.value)


def test_bad_labels_raise():
    with pytest.raises(DataError, match="integers"):
        partition(np.array([0.5, 1.0]), 1)
    with pytest.raises(DataError, match="non-negative"):
        partition(np.array([0, -1]), 1)


def test_histogram_entropy_table_and_heatmap(labels, tmp_path):
    parts = partition(labels, 10, "shards", classes_per_client=1, seed=0)
    hist = label_histogram(labels, parts, NUM_CLASSES)
    assert hist.shape == (10, NUM_CLASSES) and hist.sum() == len(labels)
    assert np.array_equal(hist.sum(axis=1), [len(p) for p in parts])
    assert np.allclose(label_entropy(labels, parts, NUM_CLASSES), 0.0)  # one class each
    iid = partition(labels, 4, "iid")
    assert np.all(label_entropy(labels, iid, NUM_CLASSES) > 3.2)  # log2(10) = 3.32
    table = format_partition_table(labels, parts, NUM_CLASSES).splitlines()
    assert len(table) == 1 + 10 + 2 and "entropy" in table[0] and "c9" in table[0]
    assert table[-2].split()[-1] == "3.322"  # pooled labels of 10 equal classes
    assert table[1].split()[1] == str(len(parts[0]))
    for suffix, magic in ((".png", b"\x89PNG"), (".pdf", b"%PDF")):
        out = plot_label_heatmap(labels, parts, NUM_CLASSES, tmp_path / f"sub/h{suffix}")
        assert out.read_bytes()[:4] == magic
    with pytest.raises(ConfigError, match=r"\.png or \.pdf"):
        plot_label_heatmap(labels, parts, NUM_CLASSES, tmp_path / "h.jpg")
