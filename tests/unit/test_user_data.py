"""Tests of fedhmc_datasets.user: npz files, tensors and torch datasets of the user's own."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from fedhmc_datasets import locate
from fedhmc_datasets.partition import PARTITIONERS, partition, partition_given
from fedhmc_datasets.registry import DatasetSplit, load_dataset
from fedhmc_datasets.user import from_datasets, from_tensors, load_npz, sha256_of
from torch.utils.data import Dataset, TensorDataset

from fedhmc.errors import ConfigError, DataError


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Never touch the real cache, FEDHMC_DATA or the Debian directory."""
    monkeypatch.setenv("FEDHMC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDHMC_DATA", raising=False)
    monkeypatch.setattr(locate, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "debian")
    return tmp_path


def make_arrays(n_train: int = 40, n_test: int = 15, seed: int = 0) -> dict[str, np.ndarray]:
    """Image-shaped (n, 1, 8, 8) features, 3 classes, 4 clients."""
    rng = np.random.default_rng(seed)
    return {
        "x_train": rng.normal(size=(n_train, 1, 8, 8)),
        "y_train": np.arange(n_train) % 3,
        "x_test": rng.normal(size=(n_test, 1, 8, 8)),
        "y_test": np.arange(n_test) % 3,
        "client_train": np.arange(n_train) % 4,
    }


def write_npz(folder: Path, arrays: dict[str, np.ndarray], name: str = "data.npz") -> Path:
    path = folder / name
    np.savez(path, **arrays)
    return path


def assert_same_content(a: DatasetSplit, b: DatasetSplit) -> None:
    for field in ("X_train", "y_train", "X_test", "y_test"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and torch.equal(x, y), field
    assert a.num_classes == b.num_classes and a.feature_shape == b.feature_shape
    if a.client_train is None:
        assert b.client_train is None
    else:
        assert torch.equal(a.client_train, b.client_train)


def raises_one_line(error, pattern: str, fn, *args, **kwargs) -> str:
    with pytest.raises(error, match=pattern) as exc:
        fn(*args, **kwargs)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


# ---------------------------------------------------------------- npz round trip


@pytest.mark.parametrize("with_clients", [True, False])
def test_npz_round_trip(tmp_path, with_clients):
    arrays = make_arrays()
    if not with_clients:
        del arrays["client_train"]
    path = write_npz(tmp_path, arrays)
    ds = load_npz(path)
    assert isinstance(ds, DatasetSplit)
    assert ds.X_train.dtype == torch.float32 and ds.X_test.dtype == torch.float32
    assert ds.y_train.dtype == torch.int64 and ds.y_test.dtype == torch.int64
    assert ds.X_train.shape == (40, 1, 8, 8) and ds.X_test.shape == (15, 1, 8, 8)
    assert ds.feature_shape == (1, 8, 8) and ds.num_features == 64
    assert ds.num_classes == 3 and ds.image_shape is None
    np.testing.assert_array_equal(ds.X_train.numpy(), arrays["x_train"].astype(np.float32))
    np.testing.assert_array_equal(ds.y_test.numpy(), arrays["y_test"])
    assert ds.name == str(path)
    assert ds.source == {"kind": "npz", "path": str(path.resolve()), "sha256": sha256_of(path)}
    assert "data.npz" in ds.description and "40 train / 15 test" in ds.description
    assert "(1, 8, 8)" in ds.description and "3 classes" in ds.description
    assert "\n" not in ds.description
    if with_clients:
        assert ds.client_train.dtype == torch.int64
        np.testing.assert_array_equal(ds.client_train.numpy(), arrays["client_train"])
        assert "4 clients" in ds.description
    else:
        assert ds.client_train is None and "no client split" in ds.description
    assert "train=(40, 1, 8, 8)" in repr(ds)


def test_npz_compressed_and_relative_path(tmp_path, monkeypatch):
    arrays = make_arrays()
    np.savez_compressed(tmp_path / "c.npz", **arrays)
    monkeypatch.chdir(tmp_path)
    ds = load_npz("c.npz")
    assert ds.name == "c.npz" and ds.source["path"] == str((tmp_path / "c.npz").resolve())


def test_checksum_equals_hashlib(tmp_path):
    path = write_npz(tmp_path, make_arrays())
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert sha256_of(path) == expected
    assert sha256_of(path, chunk_size=7) == expected  # streamed in small chunks
    assert load_npz(path).source["sha256"] == expected


def test_standardize_keeps_shape_and_uses_train_statistics(tmp_path):
    arrays = make_arrays()
    arrays["x_train"][:, 0, 0, 0] = 5.0  # a constant feature must stay finite
    ds = load_npz(write_npz(tmp_path, arrays), scaling="standardize")
    assert ds.X_train.shape == (40, 1, 8, 8)
    flat = ds.X_train.reshape(40, -1).double()
    assert torch.allclose(flat.mean(0), torch.zeros(64, dtype=torch.float64), atol=1e-5)
    assert torch.isfinite(ds.X_train).all() and torch.isfinite(ds.X_test).all()
    assert "standardised" in ds.description


@pytest.mark.parametrize("scaling", ["unit", "symmetric"])
def test_pixel_scalings_are_refused(tmp_path, scaling):
    path = write_npz(tmp_path, make_arrays())
    raises_one_line(ConfigError, "scale the features yourself", load_npz, path, scaling=scaling)
    raises_one_line(ConfigError, "unknown scaling", load_npz, path, scaling="minmax")


# ---------------------------------------------------------------- tensors and datasets


class PairDataset(Dataset):
    """A tiny custom map-style dataset returning (tensor, int)."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return torch.as_tensor(self.x[i]), int(self.y[i])


def test_tensors_datasets_and_npz_agree(tmp_path):
    a = make_arrays()
    from_file = load_npz(write_npz(tmp_path, a))
    from_np = from_tensors(a["x_train"], a["y_train"], a["x_test"], a["y_test"], a["client_train"])
    t = {k: torch.as_tensor(v) for k, v in a.items()}
    from_t = from_tensors(t["x_train"], t["y_train"], t["x_test"], t["y_test"], t["client_train"])
    custom = from_datasets(
        PairDataset(a["x_train"], a["y_train"]),
        PairDataset(a["x_test"], a["y_test"]),
        a["client_train"],
    )
    tensor_ds = from_datasets(
        TensorDataset(t["x_train"].float(), t["y_train"]),
        TensorDataset(t["x_test"].float(), t["y_test"]),
        t["client_train"],
    )
    for ds in (from_np, from_t, custom, tensor_ds):
        assert_same_content(from_file, ds)
        assert ds.source == {"kind": "in-memory tensors"}
        assert ds.name == "in-memory tensors"


def test_from_datasets_pil_images_become_channels_first():
    from PIL import Image

    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (6, 5, 7, 3), dtype=np.uint8)  # (n, H, W, C)
    gray = rng.integers(0, 256, (4, 5, 7), dtype=np.uint8)

    class Images(Dataset):
        def __init__(self, arr):
            self.arr = arr

        def __len__(self):
            return len(self.arr)

        def __getitem__(self, i):
            return Image.fromarray(self.arr[i]), torch.tensor(i % 2)

    ds = from_datasets(Images(rgb), Images(rgb[:3]))
    assert ds.feature_shape == (3, 5, 7)
    np.testing.assert_array_equal(ds.X_train.numpy(), rgb.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(ds.y_train.numpy(), np.arange(6) % 2)
    ds = from_datasets(Images(gray), Images(gray))
    assert ds.feature_shape == (1, 5, 7)
    np.testing.assert_array_equal(ds.X_train.numpy()[:, 0], gray)


def test_whole_float_labels_accepted_and_explicit_num_classes():
    a = make_arrays()
    ds = from_tensors(
        a["x_train"], a["y_train"].astype(float), a["x_test"], a["y_test"], num_classes=5
    )
    assert ds.num_classes == 5 and ds.y_train.dtype == torch.int64
    np.testing.assert_array_equal(ds.y_train.numpy(), a["y_train"])


# ---------------------------------------------------------------- bad input


def test_npz_missing_array_names_it_and_lists_contents(tmp_path):
    a = make_arrays()
    del a["y_test"]
    msg = raises_one_line(DataError, "lacks y_test", load_npz, write_npz(tmp_path, a))
    assert "x_train, y_train, x_test, client_train" in msg


def test_npz_missing_or_unreadable_file(tmp_path):
    raises_one_line(DataError, "does not exist", load_npz, tmp_path / "nope.npz")
    raises_one_line(DataError, "not a file", load_npz, tmp_path)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"this is not a zip archive")
    raises_one_line(DataError, "not a readable .npz", load_npz, junk)
    single = tmp_path / "single.npy"
    np.save(single, np.zeros(3))
    raises_one_line(DataError, "single .npy array", load_npz, single)
    obj = tmp_path / "obj.npz"
    a = make_arrays()
    a["y_train"] = np.array([{"a": 1}] * 40, dtype=object)
    np.savez(obj, **a)
    raises_one_line(DataError, "not a readable .npz", load_npz, obj)


def bad(**changes) -> dict[str, np.ndarray]:
    a = make_arrays()
    a.update(changes)
    return a


BAD_CASES = [
    (bad(y_train=np.arange(39) % 3), "x_train has 40 rows but y_train has 39"),
    (bad(y_test=np.arange(16) % 3), "x_test has 15 rows but y_test has 16"),
    (bad(x_test=np.zeros((15, 1, 8, 7))), r"x_train has features of shape \(1, 8, 8\)"),
    (
        bad(x_train=np.zeros((0, 1, 8, 8)), y_train=np.zeros(0, int), client_train=None),
        "x_train is empty",
    ),
    (bad(x_test=np.zeros((0, 1, 8, 8)), y_test=np.zeros(0, int)), "x_test is empty"),
    (bad(x_train=np.zeros(40)), r"x_train has shape \(40,\)"),
    (bad(y_train=(np.arange(40) % 3) + 0.5), "y_train must hold integer class indices"),
    (bad(y_test=np.array(["a"] * 15)), "y_test has dtype <U1"),
    (bad(y_train=np.where(np.arange(40) == 3, -1, np.arange(40) % 3)), "negative label -1"),
    (bad(y_train=np.zeros((40, 3))), r"y_train has shape \(40, 3\)"),
    (bad(y_train=np.zeros(40, int), y_test=np.zeros(15, int)), "only label 0"),
    (bad(client_train=np.arange(39) % 4), "client_train has 39 entries"),
    (bad(client_train=(np.arange(40) % 4) + 0.5), "client_train must hold integer"),
    (bad(client_train=np.arange(40) % 4 - 1), "negative client id -1"),
    (bad(client_train=(np.arange(40) % 2) * 3), r"client\(s\) 1, 2 hold no example"),
]


@pytest.mark.parametrize(("arrays", "pattern"), BAD_CASES)
def test_bad_data_raises_one_line(tmp_path, arrays, pattern):
    arrays = {k: v for k, v in arrays.items() if v is not None}
    raises_one_line(DataError, pattern, load_npz, write_npz(tmp_path, arrays))
    clients = arrays.get("client_train")
    raises_one_line(
        DataError,
        pattern,
        from_tensors,
        arrays["x_train"],
        arrays["y_train"],
        arrays["x_test"],
        arrays["y_test"],
        clients,
    )


def test_non_finite_features_say_how_many_and_where(tmp_path):
    a = make_arrays()
    a["x_test"][2, 0, 1, 1] = np.nan
    a["x_test"][4, 0, 3, 2] = np.inf
    msg = raises_one_line(DataError, "x_test holds 2 non-finite", load_npz, write_npz(tmp_path, a))
    assert "NaN or inf" in msg
    a = make_arrays()
    a["x_train"][0, 0, 0, 0] = 1e300  # finite in float64, inf in float32
    raises_one_line(DataError, "x_train holds 1 value.* float32 range", from_tensors, *a.values())


def test_labels_outside_explicit_num_classes():
    a = make_arrays()
    args = (a["x_train"], a["y_train"], a["x_test"], a["y_test"])
    raises_one_line(
        DataError, "y_train holds label 2.*num_classes=2", from_tensors, *args, num_classes=2
    )
    raises_one_line(
        ConfigError, "num_classes must be an integer >= 2", from_tensors, *args, num_classes=1
    )
    raises_one_line(ConfigError, "num_classes", from_tensors, *args, num_classes=2.5)
    a["y_test"] = a["y_test"] + 3  # test labels past the train labels widen num_classes
    assert from_tensors(a["x_train"], a["y_train"], a["x_test"], a["y_test"]).num_classes == 6


def test_from_datasets_bad_items():
    x = torch.zeros(4, 3)
    y = torch.arange(4) % 2
    good = TensorDataset(x, y)

    class Ragged(Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return torch.zeros(3 + i), 0

    class Single(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return torch.zeros(3)

    class OneHot(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return torch.zeros(3), torch.tensor([0.0, 1.0])

    class NanItem(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return torch.full((3,), float("nan")), 0

    raises_one_line(
        DataError, r"train item 1 has features of shape \(4,\)", from_datasets, Ragged(), good
    )
    raises_one_line(DataError, "train item 0 is a Tensor, not an", from_datasets, Single(), good)
    raises_one_line(
        DataError, r"test item 0 has a label of shape \(2,\)", from_datasets, good, OneHot()
    )
    raises_one_line(DataError, "train item 0 holds 3 non-finite", from_datasets, NanItem(), good)
    raises_one_line(
        DataError, "test dataset is empty", from_datasets, good, TensorDataset(x[:0], y[:0])
    )
    raises_one_line(DataError, "has no len", from_datasets, iter([]), good)
    raises_one_line(
        DataError,
        "x_train has features of shape",
        from_datasets,
        good,
        TensorDataset(torch.zeros(4, 2), y),
    )


# ---------------------------------------------------------------- partitions


def test_partition_given():
    ids = np.array([2, 0, 1, 2, 0, 0, 1])
    parts = partition_given(ids)
    assert [p.tolist() for p in parts] == [[1, 4, 5], [2, 6], [0, 3]]
    assert all(p.dtype == np.int64 for p in parts)
    assert [p.tolist() for p in partition_given(torch.as_tensor(ids))] == [
        p.tolist() for p in parts
    ]
    msg = raises_one_line(
        DataError, r"client\(s\) 1, 3 hold no example", partition_given, [0, 2, 4]
    )
    assert "client_ids" in msg
    raises_one_line(DataError, "negative client id", partition_given, [0, -1])
    raises_one_line(DataError, "1-D", partition_given, [[0, 1]])
    raises_one_line(DataError, "empty", partition_given, np.zeros(0, int))
    many = np.arange(30) * 2  # 29 empty ids: the message lists 10 and counts the rest
    raises_one_line(DataError, "and 19 more", partition_given, many)


def test_partition_given_on_loaded_split(tmp_path):
    ds = load_npz(write_npz(tmp_path, make_arrays()))
    parts = partition_given(ds.client_train)
    assert len(parts) == 4
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(ds.y_train)))
    for client, p in enumerate(parts):
        assert (ds.client_train.numpy()[p] == client).all()


@pytest.mark.parametrize("method", PARTITIONERS)
def test_existing_partitioners_run_on_user_labels(method):
    # Labels with gaps (classes 0, 2 and 5 only) and an unbalanced mix, via from_tensors.
    rng = np.random.default_rng(3)
    y = rng.choice([0, 2, 5], size=300, p=[0.5, 0.3, 0.2])
    ds = from_tensors(rng.normal(size=(300, 2, 3)), y, rng.normal(size=(20, 2, 3)), y[:20])
    assert ds.num_classes == 6
    parts = partition(ds.y_train, 5, method, seed=0)
    assert len(parts) == 5 and all(len(p) > 0 for p in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(300))


# ---------------------------------------------------------------- registry fields


def test_digits_image_shape_matches_sklearn_images():
    from sklearn.datasets import load_digits

    ds = load_dataset("digits", scaling="none")
    assert ds.image_shape == (1, 8, 8) and ds.num_features == 64 == int(np.prod(ds.image_shape))
    assert ds.feature_shape == (64,) and ds.client_train is None and ds.source is None
    raw = load_digits()
    n = len(ds.X_train)
    images = ds.X_train.reshape(n, *ds.image_shape).numpy()
    for row in (0, 1, n - 1):
        hits = np.flatnonzero((raw.data == ds.X_train[row].numpy()).all(axis=1))
        assert len(hits) >= 1
        np.testing.assert_array_equal(images[row, 0], raw.images[hits[0]])


@pytest.mark.parametrize(("name", "shape"), [("breast-cancer", None), ("blr-synthetic", None)])
def test_registry_non_image_shape(name, shape):
    ds = load_dataset(name)
    assert ds.image_shape is shape
    assert ds.num_features == ds.X_train.shape[1] and ds.feature_shape == (ds.num_features,)


def test_huge_ids_do_not_allocate():
    msg = raises_one_line(DataError, r"client\(s\) 1, 2, 3", partition_given, [0, 10**15])
    assert "and 999999999999989 more" in msg
    raises_one_line(DataError, "not whole numbers", partition_given, [0.0, 1e30])


def test_cifar2_and_mnist_image_shapes(tmp_path):
    import gzip
    import pickle
    import struct

    rng = np.random.default_rng(0)
    folder = tmp_path / "c" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rows = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {"labels": [0, 1, 2, 1], "data": rng.integers(0, 256, (4, 3072), dtype=np.uint8)}
        (folder / name).write_bytes(pickle.dumps(entry))
        rows[name] = entry["data"]
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": ["airplane"]}))
    ds = load_dataset("cifar2", data_dir=tmp_path / "c", scaling="none")
    assert ds.image_shape == (3, 32, 32) and ds.num_features == 3072
    images = ds.X_train.reshape(len(ds.X_train), *ds.image_shape).numpy()
    # CIFAR's rows are 1024 red, then 1024 green, then 1024 blue pixels: (C, H, W).
    native = rows["data_batch_1"][0].reshape(3, 32, 32)
    np.testing.assert_array_equal(images[0], native)

    mnist = tmp_path / "m"
    mnist.mkdir()
    imgs = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    labels = np.arange(5, dtype=np.uint8)
    for prefix in ("train", "t10k"):
        head = struct.pack(">IIII", 2051, *imgs.shape)
        (mnist / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(head + imgs.tobytes()))
        head = struct.pack(">II", 2049, len(labels))
        (mnist / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(
            gzip.compress(head + labels.tobytes())
        )
    ds = load_dataset("mnist", data_dir=mnist, scaling="none")
    assert ds.image_shape == (1, 28, 28) and ds.num_features == 784
    np.testing.assert_array_equal(ds.X_train.reshape(5, *ds.image_shape).numpy()[:, 0], imgs)
