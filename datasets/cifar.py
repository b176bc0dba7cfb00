"""CIFAR-2: the airplane (0) and automobile (1) classes of CIFAR-10, through torchvision.

The files are CIFAR-10's python pickle batches (``data_batch_1`` .. ``data_batch_5``,
``test_batch``, ``batches.meta``) in ``<dir>/cifar-10-batches-py/``, or directly in ``<dir>``.

torchvision's `CIFAR10` checks the md5 sum of every batch against
the official release. We parse with the subclass `CIFAR10Files`, whose md5 entries are
``None``; torchvision's ``check_integrity`` then only checks that each file exists. This lets
re-packed copies (and the small generated files of the tests) load; corrupt or truncated
files are still caught, because a batch that does not unpickle into the expected arrays raises
`DataError` naming the file. Batches are pickles: only load files you trust.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from urllib.error import URLError

import numpy as np

from fedhmc.errors import DataError

from . import locate
from .mnist import RawImages

# torchvision's names for the release's folder and files (torchvision itself is imported
# only when CIFAR-10 is loaded: it takes seconds, which every other dataset would pay).
BATCH_DIR = "cifar-10-batches-py"
META_FILE = "batches.meta"
BATCH_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", META_FILE)
CLASSES = (0, 1)  # airplane, automobile


def _files_class():
    """torchvision's CIFAR10 with the md5 checks replaced by existence checks."""
    from torchvision.datasets import CIFAR10

    class CIFAR10Files(CIFAR10):
        train_list = [[f, None] for f, _ in CIFAR10.train_list]
        test_list = [[f, None] for f, _ in CIFAR10.test_list]
        meta = {**CIFAR10.meta, "md5": None}

    return CIFAR10Files


def _locate(data_dir: str | os.PathLike | None) -> Path | None:
    """Return the torchvision root (parent of ``cifar-10-batches-py``) of the first full copy."""
    for base in locate.search_dirs(data_dir):
        for folder in (base / BATCH_DIR, base):
            if not all((folder / f).is_file() for f in BATCH_FILES):
                continue
            if folder.name == BATCH_DIR:
                return folder.parent
            return locate.prepare_dir("CIFAR10", {f: folder / f for f in BATCH_FILES}, BATCH_DIR)
    return None


def _check_file(path: Path) -> str | None:
    """Return what is wrong with one batch file, or None if it looks right."""
    try:
        with open(path, "rb") as fh:
            entry = pickle.load(fh, encoding="latin1")
    except Exception as exc:  # any unpickling failure means a bad file
        return str(exc).replace("\n", " ") or type(exc).__name__
    if not isinstance(entry, dict):
        return "not a dict"
    if path.name == META_FILE:
        return None if "label_names" in entry else "no 'label_names'"
    data, labels = entry.get("data"), entry.get("labels")
    if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3072:
        return "'data' is not an (n, 3072) array"
    if labels is None or len(labels) != len(data):
        return "'labels' does not match 'data'"
    return None


def _load_split(root: Path, train: bool) -> tuple[np.ndarray, np.ndarray]:
    try:
        ds = _files_class()(root=str(root), train=train, download=False)
    except Exception as exc:  # re-raised as DataError naming the file
        for name in BATCH_FILES:
            problem = _check_file(root / BATCH_DIR / name)
            if problem is not None:
                origin = (root / BATCH_DIR / name).resolve()
                raise DataError(
                    f"{origin} is corrupt or truncated ({problem}); replace it with a complete "
                    "copy of the CIFAR-10 python batches"
                ) from exc
        raise DataError(f"cannot read CIFAR-10 batches in {root / BATCH_DIR} ({exc})") from exc
    data = np.asarray(ds.data)  # (n, 32, 32, 3) uint8, HWC
    labels = np.asarray(ds.targets, dtype=np.int64)
    keep = np.isin(labels, CLASSES)
    images = data[keep].transpose(0, 3, 1, 2).reshape(int(keep.sum()), -1)  # CHW order
    return np.ascontiguousarray(images), (labels[keep] == CLASSES[1]).astype(np.int64)


def load_cifar2(*, data_dir: str | os.PathLike | None = None, download: bool = False) -> RawImages:
    """Load CIFAR-2 unscaled: CIFAR-10 airplanes (label 0) and automobiles (label 1).

    Parameters
    ----------
    data_dir : path-like, optional
        First directory to look in (see `fedhmc_datasets.locate` for the order).
    download : bool
        When no copy is found, let torchvision download CIFAR-10 into ``data_dir`` (or the
        cache directory).

    Returns
    -------
    RawImages
        uint8 images flattened to 3072 features in channel-major (C, H, W) order, as
        ``ToTensor()`` lays them out; 10,000 train and 2,000 test images for the real data.

    Raises
    ------
    DataError
        When no copy is found (the message lists the directories looked in), or a batch file
        is corrupt or truncated (the message names the file).
    """
    root = _locate(data_dir)
    if root is None:
        if not download:
            looked = ", ".join(str(d) for d in locate.search_dirs(data_dir))
            raise DataError(
                f"cifar2 not found: looked in {looked} (each directly and in {BATCH_DIR}/) for "
                "the CIFAR-10 python batches data_batch_1..5, test_batch and batches.meta; "
                "pass --data-dir DIR holding them, set FEDHMC_DATA, or pass --download"
            )
        root = locate.download_dir(data_dir)
        from torchvision.datasets import CIFAR10

        try:
            CIFAR10(root=str(root), train=True, download=True)
        except (RuntimeError, URLError, OSError) as exc:
            detail = str(exc).replace("\n", " ")
            raise DataError(
                f"downloading CIFAR-10 into {root} failed ({detail}); check the network "
                "connection, or get the python batches by hand and pass --data-dir"
            ) from exc
    X_train, y_train = _load_split(root, train=True)
    X_test, y_test = _load_split(root, train=False)
    return RawImages(X_train, y_train, X_test, y_test, str(root / BATCH_DIR))
