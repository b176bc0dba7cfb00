"""Tests of fedhmc_datasets: loaders on generated files, lookup order, errors, real data."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from fedhmc_datasets import locate
from fedhmc_datasets.registry import DATASETS, DatasetSplit, load_dataset
from fedhmc_datasets.synthetic import make_blr_synthetic

from fedhmc.errors import ConfigError, DataError

CLASS_NAMES = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST", "kmnist": "KMNIST"}
REAL_FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Never touch the real cache, FEDHMC_DATA or the Debian directory."""
    monkeypatch.setenv("FEDHMC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDHMC_DATA", raising=False)
    monkeypatch.setattr(locate, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "debian")
    return tmp_path


# ---------------------------------------------------------------- generated IDX files


def make_idx(n_train: int = 30, n_test: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": ((np.arange(n_test) * 3) % 10).astype(np.uint8),
    }


def idx_bytes(arr: np.ndarray) -> bytes:
    if arr.ndim == 3:  # magic 2051: unsigned bytes, 3 dimensions
        header = struct.pack(">IIII", 2051, *arr.shape)
    else:  # magic 2049: unsigned bytes, 1 dimension
        header = struct.pack(">II", 2049, arr.shape[0])
    return header + arr.tobytes()


def write_idx(folder: Path, data: dict[str, np.ndarray], gz: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in data.items():
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(idx_bytes(arr)))
        else:
            (folder / name).write_bytes(idx_bytes(arr))
    return folder


@pytest.mark.parametrize("name", ["fashion-mnist", "mnist", "kmnist"])
@pytest.mark.parametrize("layout", ["gz-flat", "torchvision-raw", "gz-torchvision-raw"])
def test_idx_loaders(tmp_path, name, layout):
    data = make_idx()
    root = tmp_path / "data"
    if layout == "gz-flat":  # as the Debian package ships them
        write_idx(root, data, gz=True)
    else:
        write_idx(root / CLASS_NAMES[name] / "raw", data, gz=layout.startswith("gz"))
    ds = load_dataset(name, data_dir=root, scaling="unit")
    assert isinstance(ds, DatasetSplit) and ds.name == name and ds.num_classes == 10
    assert ds.X_train.shape == (30, 784) and ds.X_test.shape == (12, 784)
    assert ds.num_features == 784
    assert ds.X_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    expected = data["train-images-idx3-ubyte"].reshape(30, -1) / 255.0
    assert np.allclose(ds.X_train.numpy(), expected, atol=1e-6)
    assert np.allclose(ds.X_test.numpy(), data["t10k-images-idx3-ubyte"].reshape(12, -1) / 255.0)
    assert np.array_equal(ds.y_train.numpy(), data["train-labels-idx1-ubyte"])
    assert np.array_equal(ds.y_test.numpy(), data["t10k-labels-idx1-ubyte"])
    prepared = tmp_path / "cache" / "prepared"
    assert prepared.exists() == (layout != "torchvision-raw"), "prepare only what needs it"

    raw = load_dataset(name, data_dir=root, scaling="none")
    assert np.array_equal(raw.X_train.numpy(), data["train-images-idx3-ubyte"].reshape(30, -1))
    std = load_dataset(name, data_dir=root)  # default: standardize
    assert "pixels/255, standardised with train mean/std" in std.description
    assert torch.allclose(std.X_train.mean(0), torch.zeros(784), atol=1e-5)
    assert torch.allclose(std.X_train.std(0, unbiased=False), torch.ones(784), atol=1e-4)
    assert torch.isfinite(std.X_test).all()


def test_prepared_cache_is_reused_and_refreshed(tmp_path):
    root = write_idx(tmp_path / "d", make_idx(), gz=True)
    load_dataset("mnist", data_dir=root)
    (marker,) = (tmp_path / "cache" / "prepared").glob("MNIST-*/.fedhmc-complete")
    stamp = marker.stat().st_mtime_ns
    load_dataset("mnist", data_dir=root)
    assert marker.stat().st_mtime_ns == stamp, "second load must reuse the prepared copy"
    write_idx(root, make_idx(n_train=20), gz=True)  # the source changed: rebuild
    assert load_dataset("mnist", data_dir=root).X_train.shape == (20, 784)
    leftovers = [p.name for p in marker.parent.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == [], "temporary folders must be cleaned up"


def test_lookup_order(tmp_path, monkeypatch):
    sizes = {"arg": 11, "env": 12, "debian": 13, "cache": 14}
    write_idx(tmp_path / "arg", make_idx(sizes["arg"]), gz=True)
    write_idx(tmp_path / "env" / "fashion-mnist", make_idx(sizes["env"]), gz=True)
    write_idx(tmp_path / "debian", make_idx(sizes["debian"]), gz=True)
    write_idx(tmp_path / "cache" / "FashionMNIST" / "raw", make_idx(sizes["cache"]), gz=False)
    monkeypatch.setenv("FEDHMC_DATA", str(tmp_path / "env"))

    def n_train(**kw) -> int:
        return load_dataset("fashion-mnist", **kw).X_train.shape[0]

    assert n_train(data_dir=tmp_path / "arg") == sizes["arg"]  # data_dir beats FEDHMC_DATA
    assert n_train() == sizes["env"]  # FEDHMC_DATA beats the Debian directory
    assert n_train(data_dir=tmp_path / "nothing-here") == sizes["env"]
    monkeypatch.delenv("FEDHMC_DATA")
    assert n_train() == sizes["debian"]  # the Debian directory beats the cache
    monkeypatch.setattr(locate, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "gone")
    assert n_train() == sizes["cache"]
    # The Debian directory is for Fashion-MNIST only.
    write_idx(tmp_path / "debian2", make_idx(), gz=True)
    monkeypatch.setattr(locate, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "debian2")
    with pytest.raises(DataError, match="mnist not found"):
        load_dataset("mnist")


def test_missing_data_message(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHMC_DATA", str(tmp_path / "envdir"))
    with pytest.raises(DataError) as exc:
        load_dataset("fashion-mnist", data_dir=tmp_path / "argdir")
    msg = str(exc.value)
    assert "\n" not in msg
    looked = [tmp_path / "argdir", tmp_path / "envdir", tmp_path / "debian", tmp_path / "cache"]
    positions = [msg.index(str(d)) for d in looked]
    assert positions == sorted(positions), "directories listed in lookup order"
    for hint in ("apt-get install dataset-fashion-mnist", "--data-dir", "--download"):
        assert hint in msg
    with pytest.raises(DataError) as exc:
        load_dataset("kmnist")
    assert "dataset-fashion-mnist" not in str(exc.value) and "--download" in str(exc.value)


def test_failed_download_is_a_data_error(monkeypatch):
    from torchvision.datasets import CIFAR10, MNIST

    def offline(self):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nno network")

    monkeypatch.setattr(MNIST, "download", offline)
    monkeypatch.setattr(CIFAR10, "download", offline)
    for name in ("mnist", "cifar2"):
        with pytest.raises(DataError, match="failed.*no network") as exc:
            load_dataset(name, download=True)
        assert "\n" not in str(exc.value)


def test_truncated_extracted_idx_names_the_file(tmp_path):
    raw = write_idx(tmp_path / "d" / "KMNIST" / "raw", make_idx(), gz=False)
    bad = raw / "t10k-images-idx3-ubyte"
    bad.write_bytes(bad.read_bytes()[:1000])
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte is corrupt or truncated") as exc:
        load_dataset("kmnist", data_dir=tmp_path / "d")
    assert str(bad) in str(exc.value) and "\n" not in str(exc.value)


def test_truncated_gz_names_the_file_and_leaves_no_partial_cache(tmp_path):
    root = write_idx(tmp_path / "d", make_idx(), gz=True)
    bad = root / "train-images-idx3-ubyte.gz"
    good = bad.read_bytes()
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz is corrupt or truncated"):
        load_dataset("fashion-mnist", data_dir=root)
    prepared = tmp_path / "cache" / "prepared"
    assert list(prepared.glob("*/.fedhmc-complete")) == []
    assert [p for p in prepared.iterdir() if p.name.startswith(".")] == []
    bad.write_bytes(good)  # after a fix the data loads
    assert load_dataset("fashion-mnist", data_dir=root).X_train.shape == (30, 784)


def test_gz_of_truncated_idx_names_the_gz(tmp_path):
    root = write_idx(tmp_path / "d", make_idx(), gz=True)
    labels = idx_bytes(make_idx()["train-labels-idx1-ubyte"])
    (root / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels[:20]))
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz"):
        load_dataset("mnist", data_dir=root)
    bad_magic = struct.pack(">II", 2051, 30) + bytes(30)  # images magic in a labels file
    (root / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bad_magic))
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz"):
        load_dataset("mnist", data_dir=root)


# ---------------------------------------------------------------- generated CIFAR batches


def write_cifar(folder: Path, per_batch: int = 20, seed: int = 0) -> dict[str, dict]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {
            "batch_label": name,
            "labels": [int(v) for v in rng.integers(0, 10, per_batch)],
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
        }
        (folder / name).write_bytes(pickle.dumps(entry))
        batches[name] = entry
    meta = {"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog"]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    return batches


def expected_cifar2(batches: dict[str, dict], names: list[str]):
    data = np.concatenate([batches[n]["data"] for n in names])
    labels = np.concatenate([batches[n]["labels"] for n in names])
    keep = (labels == 0) | (labels == 1)
    return data[keep], labels[keep]


@pytest.mark.parametrize("nested", [True, False])
def test_cifar2_filter(tmp_path, nested):
    folder = tmp_path / "c" / "cifar-10-batches-py" if nested else tmp_path / "c"
    batches = write_cifar(folder)
    ds = load_dataset("cifar2", data_dir=tmp_path / "c", scaling="unit")
    X, y = expected_cifar2(batches, [f"data_batch_{i}" for i in range(1, 6)])
    Xt, yt = expected_cifar2(batches, ["test_batch"])
    assert ds.num_classes == 2 and ds.num_features == 3072
    assert ds.X_train.shape == (len(y), 3072) and ds.X_test.shape == (len(yt), 3072)
    assert set(ds.y_train.tolist()) == {0, 1}
    assert np.array_equal(ds.y_train.numpy(), y) and np.array_equal(ds.y_test.numpy(), yt)
    # Rows keep CIFAR's channel-major order (the same as ToTensor().flatten()).
    assert np.allclose(ds.X_train.numpy(), X / 255.0) and np.allclose(ds.X_test.numpy(), Xt / 255)


def test_cifar2_corrupt_batch_names_the_file(tmp_path):
    folder = tmp_path / "c" / "cifar-10-batches-py"
    write_cifar(folder)
    bad = folder / "data_batch_3"
    bad.write_bytes(bad.read_bytes()[:500])
    with pytest.raises(DataError, match="data_batch_3 is corrupt or truncated") as exc:
        load_dataset("cifar2", data_dir=tmp_path / "c")
    assert "\n" not in str(exc.value)


def test_cifar2_missing_lists_directories(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHMC_DATA", str(tmp_path / "env"))
    write_cifar(tmp_path / "partial")
    (tmp_path / "partial" / "test_batch").unlink()
    with pytest.raises(DataError) as exc:
        load_dataset("cifar2", data_dir=tmp_path / "partial")
    msg = str(exc.value)
    for d in (tmp_path / "partial", tmp_path / "env", tmp_path / "cache"):
        assert str(d) in msg
    assert "--data-dir" in msg and "--download" in msg and "\n" not in msg


# ---------------------------------------------------------------- names and options


def test_unknown_name_lists_valid_names():
    with pytest.raises(ConfigError) as exc:
        load_dataset("imagenet")
    assert "'imagenet'" in str(exc.value)
    for name in DATASETS:
        assert name in str(exc.value)


def test_bad_options():
    with pytest.raises(ConfigError, match="standardize, unit, symmetric, none"):
        load_dataset("digits", scaling="minmax")
    with pytest.raises(ConfigError, match="only to blr-synthetic"):
        load_dataset("digits", dim=5)
    with pytest.raises(ConfigError, match="test_fraction"):
        load_dataset("digits", test_fraction=1.5)
    with pytest.raises(ConfigError, match="seed"):
        load_dataset("digits", seed=-3)


# ---------------------------------------------------------------- scikit-learn datasets


@pytest.mark.parametrize(
    ("name", "n", "features", "classes"),
    [("digits", 1797, 64, 10), ("breast-cancer", 569, 30, 2)],
)
def test_tabular(name, n, features, classes):
    ds = load_dataset(name)
    assert ds.num_classes == classes and ds.num_features == features
    assert len(ds.y_train) + len(ds.y_test) == n
    assert abs(len(ds.y_test) - 0.2 * n) <= 1
    # Stratified: each class has the same share in train and test, up to rounding.
    for c in range(classes):
        in_test = int((ds.y_test == c).sum())
        in_all = in_test + int((ds.y_train == c).sum())
        assert abs(in_test - 0.2 * in_all) <= 1
    # Standardised with the TRAINING set's statistics.
    mean, std = ds.X_train.double().mean(0), ds.X_train.double().std(0, unbiased=False)
    varying = std > 0
    assert torch.allclose(mean, torch.zeros_like(mean), atol=1e-5)
    assert torch.allclose(std[varying], torch.ones_like(std[varying]), atol=1e-4)
    assert torch.isfinite(ds.X_train).all() and torch.isfinite(ds.X_test).all()
    assert not torch.allclose(
        ds.X_test.double().mean(0), torch.zeros(features, dtype=torch.float64)
    )
    other = load_dataset(name, seed=1)
    assert not torch.equal(other.y_test, ds.y_test)
    assert torch.equal(load_dataset(name, seed=0).X_train, ds.X_train)


def test_digits_constant_pixels_and_unit_scaling():
    ds = load_dataset("digits")
    assert (ds.X_train.std(0) == 0).any(), "digits has constant pixels; they must stay 0"
    unit = load_dataset("digits", scaling="unit")
    assert unit.X_train.min() == 0.0 and unit.X_train.max() == 1.0
    bc = load_dataset("breast-cancer", scaling="unit")  # no-op for tabular
    assert bc.X_train.max() > 100


# ---------------------------------------------------------------- simulated data


def test_blr_synthetic():
    ds = load_dataset("blr-synthetic")
    assert ds.num_classes == 2 and ds.num_features == 1000
    assert ds.X_train.shape == (1000, 1000) and ds.X_test.shape == (250, 1000)
    assert set(ds.y_train.unique().tolist()) == {0, 1}
    # Documented model: x ~ N(0, I/d), unscaled by default, labels informative but noisy.
    assert abs(ds.X_train.var().item() * 1000 - 1.0) < 0.02
    assert 0.35 < ds.y_train.float().mean().item() < 0.65
    sim = make_blr_synthetic(dim=1000, num_examples=1000, num_test=250, seed=0)
    assert np.array_equal(ds.X_train.numpy(), sim.X_train)
    logits = sim.X_train @ sim.theta_star
    agree = np.mean((logits > 0) == (sim.y_train == 1))
    assert 0.6 < agree < 0.9
    assert torch.equal(load_dataset("blr-synthetic").X_train, ds.X_train)  # reproducible
    assert not torch.equal(load_dataset("blr-synthetic", seed=1).X_train, ds.X_train)
    small = load_dataset("blr-synthetic", dim=10, num_examples=40, scaling="standardize")
    assert small.X_train.shape == (40, 10) and small.X_test.shape == (10, 10)
    assert torch.allclose(small.X_train.mean(0), torch.zeros(10), atol=1e-5)
    with pytest.raises(ConfigError, match="dim must be a positive integer, got 0"):
        load_dataset("blr-synthetic", dim=0)


# ---------------------------------------------------------------- the real Fashion-MNIST


def test_real_fashion_mnist(monkeypatch):
    if not REAL_FASHION.is_dir():
        pytest.skip(
            f"{REAL_FASHION} not found; install it with `apt-get install dataset-fashion-mnist`"
        )
    monkeypatch.setattr(locate, "DEBIAN_FASHION_MNIST_DIR", REAL_FASHION)
    ds = load_dataset("fashion-mnist", scaling="unit")
    assert ds.X_train.shape == (60000, 784) and ds.X_test.shape == (10000, 784)
    assert ds.num_classes == 10 and ds.num_features == 784
    assert torch.equal(torch.bincount(ds.y_train), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(ds.y_test), torch.full((10,), 1000))
    assert ds.X_train.min() == 0.0 and ds.X_train.max() == 1.0
    assert str(REAL_FASHION) in ds.description


def test_cifar_file_names_are_torchvisions():
    """The loader names the release's files itself (so that importing it costs no
    torchvision import); they must stay torchvision's."""
    from fedhmc_datasets import cifar
    from torchvision.datasets import CIFAR10

    assert cifar.BATCH_DIR == CIFAR10.base_folder
    expected = [f for f, _ in CIFAR10.train_list + CIFAR10.test_list] + [CIFAR10.meta["filename"]]
    assert list(cifar.BATCH_FILES) == expected
    assert cifar.META_FILE == CIFAR10.meta["filename"]


def test_dataset_registry_imports_neither_torchvision_nor_sklearn():
    """A digits or Fashion-MNIST run must not pay for torchvision's import, nor any run
    for scikit-learn's before it loads a scikit-learn dataset."""
    import subprocess
    import sys

    code = (
        "import sys, fedhmc_datasets.registry; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torchvision', 'sklearn'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
