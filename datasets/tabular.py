"""Small datasets embedded in scikit-learn (no files, no network): digits and breast-cancer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhmc.errors import ConfigError

PIXEL_MAX = {"digits": 16.0, "breast-cancer": None}
"""Largest feature value of image-like datasets (digits: 8x8 pixel counts 0..16)."""


@dataclass(frozen=True)
class TabularSplit:
    """Unscaled features and labels after a stratified train/test split."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    num_classes: int


def load_tabular(name: str, *, seed: int = 0, test_fraction: float = 0.2) -> TabularSplit:
    """Load ``digits`` (1797 x 64, 10 classes) or ``breast-cancer`` (569 x 30, 2 classes).

    Parameters
    ----------
    name : {"digits", "breast-cancer"}
        Dataset name.
    seed : int
        Seed of the split.
    test_fraction : float
        Fraction of examples in the test set, in (0, 1).

    Returns
    -------
    TabularSplit
        A split stratified by label: each class has (up to rounding) the same share in train
        and test as in the whole dataset.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction must be between 0 and 1 (exclusive), got {test_fraction}")
    # scikit-learn is imported here, not with the module: it takes seconds, which the
    # other datasets need not pay.
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    loader = {"digits": datasets.load_digits, "breast-cancer": datasets.load_breast_cancer}[name]
    X, y = loader(return_X_y=True)
    try:
        X_train, X_test, y_train, y_test = train_test_split(
            X, y, test_size=test_fraction, random_state=seed, stratify=y
        )
    except ValueError as exc:  # e.g. fewer test examples than classes
        raise ConfigError(
            f"cannot split {name} with test_fraction={test_fraction}: {str(exc).strip()}; "
            "choose a test_fraction that leaves every class in both sets"
        ) from exc
    num_classes = int(np.max(y)) + 1
    return TabularSplit(
        X_train, y_train.astype(np.int64), X_test, y_test.astype(np.int64), num_classes
    )
