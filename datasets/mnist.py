"""MNIST, Fashion-MNIST and Kuzushiji-MNIST, parsed by torchvision's own dataset classes.

A directory may hold the four IDX files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each extracted or as ``.gz``) in one of
three places, tried in this order: torchvision's layout ``<dir>/<ClassName>/raw/`` (e.g.
``FashionMNIST/raw``), a sub-folder named after the dataset (``<dir>/fashion-mnist/``), or
``<dir>`` itself (the Debian layout). Files torchvision cannot read where they are (``.gz`` files,
or any flat layout) are prepared once in the cache by `fedhmc_datasets.locate.prepare_dir`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.error import URLError

import numpy as np

from fedhmc.errors import DataError

from . import locate

IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
# torchvision's dataset class of each, by name: torchvision itself is imported only when
# the files are parsed (its import takes seconds, which a run on other data would pay).
_CLASS_NAMES = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST", "kmnist": "KMNIST"}
_PARSE_ERRORS = (AssertionError, ValueError, TypeError, RuntimeError, IndexError, KeyError)


@dataclass(frozen=True)
class RawImages:
    """Unscaled images of a dataset with an official train/test split."""

    X_train: np.ndarray  # uint8, (n, ...)
    y_train: np.ndarray  # int64
    X_test: np.ndarray
    y_test: np.ndarray
    source: str  # where the files were found


def _find_files(folder: Path) -> dict[str, Path] | None:
    """Map each IDX name to an extracted file, else its ``.gz``; None if any is missing."""
    found: dict[str, Path] = {}
    for name in IDX_FILES:
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                found[name] = candidate
                break
    return found if len(found) == len(IDX_FILES) else None


def _locate(name: str, data_dir: str | os.PathLike | None) -> tuple[Path, dict[str, Path]] | None:
    """Return (torchvision root, {file name: origin}) of the first location holding all files."""
    cls_name = _CLASS_NAMES[name]
    system = [locate.DEBIAN_FASHION_MNIST_DIR] if name == "fashion-mnist" else []
    for base in locate.search_dirs(data_dir, system):
        for folder in (base / cls_name / "raw", base / name, base):
            found = _find_files(folder)
            if found is None:
                continue
            native = folder == base / cls_name / "raw"
            if native and all(p.suffix != ".gz" for p in found.values()):
                return base, found
            root = locate.prepare_dir(cls_name, found, f"{cls_name}/raw")
            return root, found
    return None


def _not_found(name: str, data_dir: str | os.PathLike | None) -> DataError:
    cls_name = _CLASS_NAMES[name]
    system = [locate.DEBIAN_FASHION_MNIST_DIR] if name == "fashion-mnist" else []
    looked = ", ".join(str(d) for d in locate.search_dirs(data_dir, system))
    how = "install it with `apt-get install dataset-fashion-mnist`, " if system else ""
    return DataError(
        f"{name} not found: looked in {looked} (each directly, in {name}/ and in "
        f"{cls_name}/raw/) for the four IDX files train-images-idx3-ubyte[.gz] etc.; "
        f"{how}pass --data-dir DIR holding them, set FEDHMC_DATA, or pass --download"
    )


def _culprit(raw: Path, origins: dict[str, Path]) -> DataError | None:
    """Parse each file alone to find the one torchvision could not read."""
    from torchvision.datasets.mnist import read_image_file, read_label_file

    for fname in IDX_FILES:
        reader = read_image_file if "images" in fname else read_label_file
        try:
            reader(str(raw / fname))
        except _PARSE_ERRORS + (OSError,) as exc:
            detail = str(exc).replace("\n", " ") or type(exc).__name__
            return DataError(
                f"{origins[fname]} is corrupt or truncated ({detail}); "
                "replace it with a complete copy of the IDX file"
            )
    return None


def _load_split(cls, root: Path, origins: dict[str, Path], train: bool):
    try:
        ds = cls(root=str(root), train=train, download=False)
    except _PARSE_ERRORS as exc:
        err = _culprit(root / cls.__name__ / "raw", origins)
        if err is None:
            detail = str(exc).replace("\n", " ")
            err = DataError(f"cannot read {cls.__name__} files in {root} ({detail})")
        raise err from exc
    images, labels = ds.data.numpy(), ds.targets.numpy().astype(np.int64)
    prefix = "train" if train else "t10k"
    if images.ndim != 3 or images.shape[1:] != (28, 28) or len(images) == 0:
        raise DataError(
            f"{origins[f'{prefix}-images-idx3-ubyte']} holds images of shape "
            f"{tuple(images.shape)}, expected (n, 28, 28) with n > 0; replace it"
        )
    num_classes = len(cls.classes)
    if len(labels) != len(images) or not np.all((labels >= 0) & (labels < num_classes)):
        raise DataError(
            f"{origins[f'{prefix}-labels-idx1-ubyte']} holds {len(labels)} labels for "
            f"{len(images)} images, expected one label in [0, {num_classes - 1}] per image; "
            "replace it"
        )
    return images, labels


def load_idx_images(
    name: str, *, data_dir: str | os.PathLike | None = None, download: bool = False
) -> RawImages:
    """Load ``mnist``, ``fashion-mnist`` or ``kmnist`` unscaled, with its official split.

    Parameters
    ----------
    name : {"mnist", "fashion-mnist", "kmnist"}
        Dataset name.
    data_dir : path-like, optional
        First directory to look in (see `fedhmc_datasets.locate` for the order).
    download : bool
        When no copy is found, let torchvision download one into ``data_dir`` (or the cache
        directory).

    Returns
    -------
    RawImages
        uint8 images ``(n, 28, 28)`` and int64 labels, train (60,000) and test (10,000).

    Raises
    ------
    DataError
        When no copy is found (the message lists the directories looked in), or a file is
        corrupt or truncated (the message names the file).
    """
    import torchvision.datasets

    cls = getattr(torchvision.datasets, _CLASS_NAMES[name])
    hit = _locate(name, data_dir)
    if hit is None:
        if not download:
            raise _not_found(name, data_dir)
        root = locate.download_dir(data_dir)
        try:
            cls(root=str(root), train=True, download=True)
        except (RuntimeError, URLError, OSError) as exc:
            detail = str(exc).replace("\n", " ")
            raise DataError(
                f"downloading {name} into {root} failed ({detail}); check the network "
                "connection, or get the files by hand and pass --data-dir"
            ) from exc
        raw = root / cls.__name__ / "raw"
        hit = root, {f: raw / f for f in IDX_FILES}
    root, origins = hit
    X_train, y_train = _load_split(cls, root, origins, train=True)
    X_test, y_test = _load_split(cls, root, origins, train=False)
    source = str(origins[IDX_FILES[0]].parent)
    return RawImages(X_train, y_train, X_test, y_test, source)
