"""Public entry point: `load_dataset` and `DatasetSplit`.

Every dataset comes back as float32 features ``(n, F)`` (images flattened) and int64 labels
``0 .. num_classes - 1``, with a train and a test set:

* ``digits``: scikit-learn's embedded 8x8 digits, 1797 x 64, 10 classes (the demo default).
* ``breast-cancer``: scikit-learn's embedded Wisconsin breast cancer, 569 x 30, 2 classes.
* ``fashion-mnist``, ``mnist``, ``kmnist``: IDX files parsed by torchvision, 784 features,
  10 classes, official 60,000 / 10,000 split.
* ``cifar2``: CIFAR-10 airplanes vs automobiles via torchvision, 3072 features, 2 classes,
  10,000 / 2,000.
* ``blr-synthetic``: simulated Bayesian logistic regression (Liang et al. 2024, Section 5.1),
  d = 1000 features, 1000 training examples, 2 classes.

Where files are looked for is described in `fedhmc_datasets.locate`; scaling options in
``fedhmc_datasets.scaling``. Data of your own (an ``.npz`` file, tensors or torch datasets)
is loaded into the same ``DatasetSplit`` by ``fedhmc_datasets.user``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from fedhmc.errors import ConfigError

from .cifar import load_cifar2
from .mnist import load_idx_images
from .scaling import check_scaling, scale_features
from .synthetic import check_positive_int, make_blr_synthetic
from .tabular import PIXEL_MAX, load_tabular

DATASETS = (
    "digits",
    "breast-cancer",
    "fashion-mnist",
    "mnist",
    "kmnist",
    "cifar2",
    "blr-synthetic",
)
_TITLES = {"fashion-mnist": "Fashion-MNIST", "mnist": "MNIST", "kmnist": "Kuzushiji-MNIST"}


@dataclass(frozen=True, eq=False, repr=False)
class DatasetSplit:
    """A dataset with its train and test sets, ready for a model.

    Attributes
    ----------
    name : str
        Dataset name, one of ``DATASETS``, or for user data (``fedhmc_datasets.user``)
        the path or name it was given.
    X_train, X_test : torch.Tensor
        float32 features, ``(n, ...)``: ``(n, F)`` for the named datasets (images flattened);
        user data keeps the shape it was given, e.g. ``(n, 1, 28, 28)``.
    y_train, y_test : torch.Tensor
        int64 labels in ``0 .. num_classes - 1``.
    num_classes : int
        Number of classes.
    description : str
        One human sentence on where the data came from and how it was preprocessed.
    image_shape : tuple of int, optional
        ``(channels, height, width)`` of image data stored flattened, so that
        ``X.reshape(n, *image_shape)`` gives the images; ``None`` for other data.
    client_train : torch.Tensor, optional
        int64 client id (``0 .. N - 1``) of each training row, when the user gave the split
        (see ``fedhmc_datasets.partition.partition_given``); ``None`` otherwise.
    source : dict, optional
        Where the data came from, e.g. ``{"kind": "npz", "path": ..., "sha256": ...}`` or
        ``{"kind": "in-memory tensors"}``; ``None`` for the named datasets.
    """

    name: str
    X_train: torch.Tensor
    y_train: torch.Tensor
    X_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    description: str
    image_shape: tuple[int, ...] | None = None
    client_train: torch.Tensor | None = None
    source: dict | None = None

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one example's features, ``X_train.shape[1:]``."""
        return tuple(self.X_train.shape[1:])

    @property
    def num_features(self) -> int:
        """Number of features F: the product of ``feature_shape``."""
        return int(math.prod(self.feature_shape))

    def __repr__(self) -> str:
        return (
            f"DatasetSplit(name={self.name!r}, train={tuple(self.X_train.shape)}, "
            f"test={tuple(self.X_test.shape)}, num_classes={self.num_classes})"
        )


def _labels(y: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))


def load_dataset(
    name: str,
    *,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    seed: int = 0,
    scaling: str | None = None,
    test_fraction: float = 0.2,
    dim: int | None = None,
    num_examples: int | None = None,
) -> DatasetSplit:
    """Load a dataset by name.

    Parameters
    ----------
    name : str
        One of `DATASETS` (case-insensitive; ``_`` may stand for ``-``).
    data_dir : path-like, optional
        First directory to look in for file-based datasets (then ``$FEDHMC_DATA``, the Debian
        directory for fashion-mnist, then the cache ``$FEDHMC_CACHE`` or ``~/.cache/fedhmc``).
    download : bool
        Let torchvision download a missing file-based dataset into ``data_dir`` (or the cache).
    seed : int
        Seed of the train/test split (digits, breast-cancer) or of the simulation
        (blr-synthetic). The image datasets use their official split and ignore it.
    scaling : {"standardize", "unit", "none"}, optional
        ``"standardize"``: pixels to [0, 1], then each feature centred and divided by its std,
        both from the training set (std 0 is replaced by 1). ``"unit"``: pixels to [0, 1]
        (digits: /16, others: /255); tabular and simulated features unchanged. ``"none"``: raw
        values. Default: ``"standardize"``, except ``"none"`` for blr-synthetic, whose
        simulated features are already on the scale the model assumes.
    test_fraction : float
        Test share of a stratified split (digits, breast-cancer); for blr-synthetic the test
        set has ``round(num_examples * test_fraction / (1 - test_fraction))`` examples (250 by
        default). Ignored by the image datasets.
    dim, num_examples : int, optional
        Only for blr-synthetic: dimension d and training size n (both 1000 by default).

    Returns
    -------
    DatasetSplit

    Raises
    ------
    ConfigError
        Unknown name or scaling, or an option that does not apply to the dataset.
    DataError
        Missing or corrupt files (the message says where it looked or which file is bad).
    """
    key, scaling = _checked_options(name, scaling, seed, dim, num_examples)
    if key in ("digits", "breast-cancer"):
        parts = _tabular_parts(key, seed, scaling, test_fraction)
    elif key == "blr-synthetic":
        parts = _blr_parts(seed, scaling, test_fraction, dim, num_examples)
    else:
        parts = _image_parts(key, scaling, data_dir, download)
    return DatasetSplit(name=key, **parts)


def _checked_options(name: str, scaling, seed, dim, num_examples) -> tuple[str, str]:
    """``load_dataset``'s dataset key (lower case, ``-`` for ``_``) and scaling (its default
    filled in), after checking the name, the scaling, the seed and the blr-only options."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if scaling is None:
        scaling = "none" if key == "blr-synthetic" else "standardize"
    check_scaling(scaling)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    if key != "blr-synthetic" and (dim is not None or num_examples is not None):
        raise ConfigError(f"dim and num_examples apply only to blr-synthetic, not to {key}")
    return key, scaling


def _tabular_parts(key: str, seed: int, scaling: str, test_fraction: float) -> dict:
    """digits or breast-cancer: a stratified split of scikit-learn's table (DatasetSplit's
    fields but the name)."""
    tab = load_tabular(key, seed=seed, test_fraction=test_fraction)
    Xtr, Xte, how = scale_features(tab.X_train, tab.X_test, scaling, pixel_max=PIXEL_MAX[key])
    pct = round(100 * test_fraction)
    source = f"scikit-learn {key}, stratified {100 - pct}/{pct} train/test split (seed {seed})"
    return _split_parts(
        Xtr,
        Xte,
        (tab.y_train, tab.y_test, tab.num_classes),
        f"{source}; {how}",
        (1, 8, 8) if key == "digits" else None,  # sklearn's rows are 8x8 row-major
    )


def _blr_parts(seed: int, scaling: str, test_fraction: float, dim, num_examples) -> dict:
    """blr-synthetic: the simulated Bayesian logistic regression (DatasetSplit's fields but
    the name)."""
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction must be between 0 and 1 (exclusive), got {test_fraction}")
    d = check_positive_int("dim", 1000 if dim is None else dim)
    n = check_positive_int("num_examples", 1000 if num_examples is None else num_examples)
    n_test = max(1, round(n * test_fraction / (1.0 - test_fraction)))
    sim = make_blr_synthetic(dim=d, num_examples=n, num_test=n_test, seed=seed)
    Xtr, Xte, how = scale_features(sim.X_train, sim.X_test, scaling)
    source = (
        f"simulated Bayesian logistic regression, d={d}, {n} train / {n_test} test "
        f"(seed {seed}): theta* ~ N(0, I), x ~ N(0, I/d), y ~ Bernoulli(sigmoid(x.theta*))"
    )
    return _split_parts(Xtr, Xte, (sim.y_train, sim.y_test, 2), f"{source}; {how}", None)


def _image_parts(key: str, scaling: str, data_dir, download: bool) -> dict:
    """An image dataset's official split from its files (DatasetSplit's fields but the
    name)."""
    if key == "cifar2":
        raw = load_cifar2(data_dir=data_dir, download=download)
        title, num_classes = "CIFAR-10 airplane/automobile (CIFAR-2)", 2
        image_shape = (3, 32, 32)  # load_cifar2 flattens channel-major (C, H, W)
    else:
        raw = load_idx_images(key, data_dir=data_dir, download=download)
        title, num_classes = _TITLES[key], 10
        image_shape = (1, 28, 28)
    Xtr, Xte, how = scale_features(raw.X_train, raw.X_test, scaling, pixel_max=255.0)
    source = (
        f"{title} from {raw.source}, official {len(raw.X_train)}/{len(raw.X_test)} train/test split"
    )
    labels = (raw.y_train, raw.y_test, num_classes)
    return _split_parts(Xtr, Xte, labels, f"{source}; {how}", image_shape)


def _split_parts(Xtr, Xte, labels: tuple, description: str, image_shape) -> dict:
    """DatasetSplit's fields but the name; ``labels`` = (train labels, test labels, class
    count)."""
    y_train, y_test, num_classes = labels
    return {
        "X_train": Xtr,
        "y_train": _labels(y_train),
        "X_test": Xte,
        "y_test": _labels(y_test),
        "num_classes": num_classes,
        "description": description,
        "image_shape": image_shape,
    }
