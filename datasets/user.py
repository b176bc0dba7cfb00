"""Data of your own: an ``.npz`` file, arrays or tensors, or torch datasets.

Each loader returns the same ``DatasetSplit`` as
``load_dataset``, after the same checks:

* ``load_npz``: a NumPy ``.npz`` holding ``x_train``, ``y_train``, ``x_test``, ``y_test`` and
  optionally ``client_train`` (one client id per training row: a split of your own).
* ``from_tensors``: the same arrays as torch tensors or NumPy arrays.
* ``from_datasets``: map-style ``torch.utils.data.Dataset`` objects (``len`` and
  ``ds[i] -> (x, y)``), e.g. a torchvision dataset with ``transform=ToTensor()``.

Features of any shape ``(n, ...)`` keep that shape and become float32; labels become int64 in
``0 .. num_classes - 1`` (``num_classes`` defaults to the largest label + 1). Problems raise
``DataError`` (bad data) or ``ConfigError`` (bad
option), each with a one-line message that names the array and the fix.

``scaling`` is ``"none"`` (default: features as given) or ``"standardize"`` (each feature
centred and divided by its std, both from the training set; see
``fedhmc_datasets.scaling``). ``"unit"`` and ``"symmetric"`` are refused: for the named
datasets they divide pixels by a known maximum (255, or 16 for digits), which user data does
not declare; scale such features yourself (e.g. ``x / 255``) before loading.
"""

from __future__ import annotations

import hashlib
import math
import os
import weakref
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from fedhmc.errors import ConfigError, DataError

from .partition import as_client_ids
from .registry import DatasetSplit
from .scaling import FEATURE_SCALINGS, scale_features

USER_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
OPTIONAL_ARRAYS = ("client_train",)
USER_SCALINGS = ("none", "standardize")
IN_MEMORY_NAME = "in-memory tensors"


_DIGESTS: dict[tuple, str] = {}


def _file_key(path: str | os.PathLike) -> tuple:
    """What identifies a file's contents without reading them: path, size, modification."""
    st = os.stat(path)
    return (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)


def sha256_of(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Return the SHA-256 hex digest of a file's bytes, read in chunks of ``chunk_size``.

    Remembered per file (path, size, modification time): a run resolves its settings
    several times, and a Flower client once per message, without reading the file again.
    """
    key = _file_key(path)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(chunk_size):
                digest.update(chunk)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


# ---------------------------------------------------------------- checks


def _check_scaling(scaling: str) -> str:
    if scaling in USER_SCALINGS:
        return scaling
    if scaling in FEATURE_SCALINGS:
        raise ConfigError(
            f"scaling {scaling!r} divides pixels by a known maximum, which user data does not "
            "declare; scale the features yourself (e.g. x / 255) and use scaling='none', or "
            "use scaling='standardize'"
        )
    raise ConfigError(
        f"unknown scaling {scaling!r} for user data; choose one of {', '.join(USER_SCALINGS)}"
    )


def _numpy(value, name: str) -> np.ndarray:
    """A tensor or array-like as a NumPy array (no copy where possible)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        detail = str(exc).replace("\n", " ")
        raise DataError(
            f"{name} cannot be read as an array ({detail}); pass a NumPy array or torch tensor"
        ) from exc


def _features(x: np.ndarray, name: str) -> np.ndarray:
    """Check features ``(n, ...)`` and return them as float32."""
    if x.ndim < 2:
        raise DataError(
            f"{name} has shape {x.shape}, expected (n, ...) with one row per example; for a "
            "single feature reshape it to (n, 1)"
        )
    if len(x) == 0:
        raise DataError(f"{name} is empty (shape {x.shape}); give at least one example")
    if x.size == 0:
        raise DataError(f"{name} has shape {x.shape}, i.e. no features per example; fix its shape")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)) and (
        x.dtype != np.bool_
    ):
        raise DataError(f"{name} has dtype {x.dtype}, expected real numbers; convert it to float32")
    bad = int(np.count_nonzero(~np.isfinite(x))) if x.dtype.kind == "f" else 0
    if bad:
        raise DataError(
            f"{name} holds {bad} non-finite value(s) (NaN or inf) of {x.size}; remove or impute "
            "them before loading"
        )
    with np.errstate(over="ignore"):  # values beyond float32 become inf, counted next
        x32 = np.ascontiguousarray(x, dtype=np.float32)
    bad = int(np.count_nonzero(~np.isfinite(x32)))
    if bad:
        raise DataError(
            f"{name} holds {bad} value(s) beyond the float32 range (|x| > 3.4e38); rescale "
            "them before loading"
        )
    return x32


def _labels(y: np.ndarray, name: str) -> np.ndarray:
    """Check labels ``(n,)`` of integers >= 0 and return them as int64."""
    if y.ndim != 1:
        raise DataError(
            f"{name} has shape {y.shape}, expected (n,) with one class index per example; "
            "flatten it with .reshape(-1) (one-hot labels: take .argmax(axis=1))"
        )
    if y.dtype.kind == "f":
        whole = np.isfinite(y) & (y == np.round(y)) & (np.abs(y) < 2.0**62)
        if not whole.all():
            raise DataError(
                f"{name} must hold integer class indices, but {int((~whole).sum())} value(s) are "
                f"not whole numbers (e.g. {y[~whole][0]}); give labels 0 .. C-1"
            )
    elif y.dtype.kind not in "iub":
        raise DataError(
            f"{name} has dtype {y.dtype}, expected integer class indices 0 .. C-1; map the "
            "class names to integers first"
        )
    if len(y) and y.min() < 0:
        raise DataError(
            f"{name} holds negative label {y.min():g}; labels must be class indices 0 .. C-1"
        )
    return y.astype(np.int64)


_WARNED: set[tuple] = set()


def _warn_unseen_test_labels(
    ytr: np.ndarray, yte: np.ndarray, num_classes: int, name: str = ""
) -> None:
    """One line on stderr when ``y_test`` holds labels that no training example has: no
    model can learn them, and a large one silently adds classes (label 99 makes 100).
    Said once per data set and process (a run loads its data more than once)."""
    unseen = np.setdiff1d(np.unique(yte), np.unique(ytr))
    key = (name, tuple(int(v) for v in unseen[:64]), len(ytr), len(yte))
    if unseen.size == 0 or key in _WARNED:
        return
    _WARNED.add(key)
    import sys

    shown = ", ".join(str(int(v)) for v in unseen[:5]) + (", ..." if unseen.size > 5 else "")
    count = int(np.isin(yte, unseen).sum())
    print(
        f"fedhmc: warning: y_test holds label{'s' if unseen.size > 1 else ''} {shown} "
        f"({count} of {len(yte)} test examples) that no training example has; no model can "
        f"predict {'them' if unseen.size > 1 else 'it'}, and the data count {num_classes} "
        "classes: check the labels",
        file=sys.stderr,
    )


def _split(
    arrays: tuple, *, num_classes: int | None, scaling: str, name: str, source: dict, what: str
) -> DatasetSplit:
    """Check the arrays and build the ``DatasetSplit``; ``arrays`` = (x_train, y_train,
    x_test, y_test, client_train or None); ``what`` opens the description."""
    x_train, y_train, x_test, y_test, client_train = arrays
    scaling = _check_scaling(scaling)
    if num_classes is not None and (
        isinstance(num_classes, bool)
        or not isinstance(num_classes, int | np.integer)
        or num_classes < 2
    ):
        raise ConfigError(
            f"num_classes must be an integer >= 2, got {num_classes!r}; or leave it out to "
            "use the largest label + 1"
        )
    Xtr, ytr, Xte, yte = _checked_arrays(x_train, y_train, x_test, y_test)
    num_classes = _class_count(ytr, yte, num_classes)
    _warn_unseen_test_labels(ytr, yte, num_classes, name)
    clients = None
    if client_train is not None:
        ids = as_client_ids(_numpy(client_train, "client_train"), "client_train", len(Xtr))
        clients = torch.from_numpy(ids)
    shape = Xtr.shape[1:]
    if scaling == "standardize":
        Xtr_t, Xte_t, how = scale_features(Xtr, Xte, "standardize")
        Xtr_t, Xte_t = Xtr_t.reshape(len(Xtr), *shape), Xte_t.reshape(len(Xte), *shape)
    else:
        Xtr_t, Xte_t, how = torch.from_numpy(Xtr), torch.from_numpy(Xte), "features unscaled"
    split = (
        f"its own split over {int(clients.max()) + 1} clients"
        if clients is not None
        else "no client split"
    )
    description = (
        f"{what}: {len(Xtr)} train / {len(Xte)} test examples, features of shape "
        f"{tuple(shape)}, {num_classes} classes, {split}; {how}"
    )
    return DatasetSplit(
        name=name,
        X_train=Xtr_t,
        y_train=torch.from_numpy(ytr),
        X_test=Xte_t,
        y_test=torch.from_numpy(yte),
        num_classes=num_classes,
        description=description,
        client_train=clients,
        source=source,
    )


def _checked_arrays(x_train, y_train, x_test, y_test) -> tuple:
    """The features (float32) and labels (int64) as numpy arrays, checked: one label per
    example, and the same example shape in train and test."""
    Xtr = _features(_numpy(x_train, "x_train"), "x_train")
    Xte = _features(_numpy(x_test, "x_test"), "x_test")
    ytr = _labels(_numpy(y_train, "y_train"), "y_train")
    yte = _labels(_numpy(y_test, "y_test"), "y_test")
    for part, X, y in (("train", Xtr, ytr), ("test", Xte, yte)):
        if len(X) != len(y):
            raise DataError(
                f"x_{part} has {len(X)} rows but y_{part} has {len(y)} labels; give exactly "
                "one label per example"
            )
    if Xtr.shape[1:] != Xte.shape[1:]:
        raise DataError(
            f"x_train has features of shape {Xtr.shape[1:]} but x_test has {Xte.shape[1:]}; "
            "train and test examples must have the same shape"
        )
    return Xtr, ytr, Xte, yte


def _class_count(ytr: np.ndarray, yte: np.ndarray, num_classes: int | None) -> int:
    """The class count: ``num_classes``, or the largest label + 1; every label must be
    below it."""
    top = int(max(ytr.max(), yte.max()))
    if num_classes is None:
        if top == 0:
            raise DataError(
                "y_train and y_test hold only label 0, one class; a classifier needs at least "
                "2 (pass num_classes if the data has classes absent from these sets)"
            )
        num_classes = top + 1
    num_classes = int(num_classes)
    for label_name, y in (("y_train", ytr), ("y_test", yte)):
        if y.max() >= num_classes:
            raise DataError(
                f"{label_name} holds label {int(y.max())}, out of range for num_classes="
                f"{num_classes}; labels must be 0 .. {num_classes - 1}, or raise num_classes"
            )
    return num_classes


# ---------------------------------------------------------------- .npz files

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first entry, or an empty zip
_SAVEZ = "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"


def _guarded(shown, read):
    """``read()``, with the errors of reading a damaged file as one-line ``DataError``s."""
    try:
        return read()
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise _guarded_error(shown, exc) from None


def _guarded_error(shown, exc: BaseException) -> DataError:
    detail = " ".join(str(exc).split())[:200] or type(exc).__name__
    return DataError(
        f"{shown} is not a readable .npz archive of numeric arrays ({detail}); write it with "
        f"{_SAVEZ}"
    )


def _what_it_is(head: bytes) -> str:
    """What a file that is not a zip archive looks like, from its first bytes."""
    if not head:
        return "the file is empty"
    if head[:1] == b"\x80":
        return "it is a Python pickle"
    if head[:2] == b"\x1f\x8b":
        return "it is a gzip file"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "its bytes are not a zip archive's"
    if all(c.isprintable() or c in "\t\r\n" for c in text):
        return "it is a text file"
    return "its bytes are not a zip archive's"


def _open_npz(p: Path, shown) -> np.lib.npyio.NpzFile:
    """``p`` opened as an .npz archive (close it), or a one-line ``DataError`` that says
    what the file is instead: a single .npy array, a text file, a pickle, a damaged zip."""
    with open(p, "rb") as f:
        head = f.read(64)
    if head.startswith(_NPY_MAGIC):
        raise DataError(
            f"{shown} is a single .npy array, not an .npz archive; save the arrays with {_SAVEZ}"
        )
    if not head.startswith(_ZIP_MAGIC):
        raise DataError(
            f"{shown} is not a readable .npz archive: {_what_it_is(head)}, not the zip of "
            f".npy arrays that {_SAVEZ} writes"
        )
    loaded = _guarded(shown, lambda: np.load(p, allow_pickle=False))
    if not isinstance(loaded, np.lib.npyio.NpzFile):  # pragma: no cover - magic checked
        raise DataError(f"{shown} is not an .npz archive; save the arrays with {_SAVEZ}")
    return loaded


def _member_layout(npz, key: str, shown) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of the .npz member ``key``, read from its .npy header alone
    (the data stay compressed), or a one-line ``DataError`` when it is not an array."""
    member = key if key in npz.zip.namelist() else key + ".npy"

    def read():
        with npz.zip.open(member) as f:
            if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                raise DataError(
                    f"{shown} is not a readable .npz archive of numeric arrays: its member "
                    f"{member} is not a NumPy array (no .npy header); write the file with "
                    f"{_SAVEZ}"
                )
            f.seek(0)
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                shape, _, dtype = np.lib.format._read_array_header(f, version)
        return tuple(int(n) for n in shape), np.dtype(dtype)

    return _guarded(shown, read)


def _npz_array(npz, key: str, shown) -> np.ndarray:
    """The member ``key`` of an open .npz as an array, or a one-line ``DataError``:
    a member that is no .npy, is damaged, or holds Python objects."""
    _member_layout(npz, key, shown)  # an .npy header, or one line that says it is not one
    try:
        value = npz[key]
    except ValueError as exc:
        if "allow_pickle" in str(exc) or "Object arrays" in str(exc):
            raise DataError(
                f"{shown} is not a readable .npz archive of numeric arrays: {key} holds "
                "Python objects (an object array, stored pickled); convert it to numbers "
                "(e.g. np.asarray(x, dtype=np.float32)) and save again"
            ) from None
        raise _guarded_error(shown, exc) from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise _guarded_error(shown, exc) from None
    if not isinstance(value, np.ndarray):  # pragma: no cover - the header was checked
        raise DataError(f"{shown}: {key} is not a NumPy array; write the file with {_SAVEZ}")
    return value


def _inspect(npz, shown) -> list[str]:
    """The arrays of an open .npz that a dataset reads, after the checks that need no
    decompression: the four arrays are there, each member is an .npy array, and together
    they fit in the memory that is free (a small compressed file can expand to
    gigabytes). Each failure is a one-line ``DataError``."""
    from .memory import require

    held = list(npz.files)
    missing = [k for k in USER_ARRAYS if k not in held]
    if missing:
        holds = ", ".join(held) or "nothing"
        raise DataError(
            f"{shown} lacks {', '.join(missing)} (it holds: {holds}); save it with "
            "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...[, client_train=...])"
        )
    wanted = [k for k in (*USER_ARRAYS, *OPTIONAL_ARRAYS) if k in held]
    need = 0
    for k in wanted:
        shape, dtype = _member_layout(npz, k, shown)
        n = math.prod(shape)
        need += n * dtype.itemsize
        if k.startswith("x_") and dtype != np.float32:
            need += n * 4  # the float32 copy
        elif not k.startswith("x_") and dtype != np.int64:
            need += n * 8  # labels and client ids as int64
    require(
        need,
        "cpu",
        f"{shown} (its arrays, once read)",
        "use a smaller file (fewer examples, or float32 features), or a machine with more memory",
        error=DataError,
    )
    return wanted


# ---------------------------------------------------------------- loaders


def load_npz(
    path: str | os.PathLike, *, scaling: str = "none", num_classes: int | None = None
) -> DatasetSplit:
    """Load a dataset from a NumPy ``.npz`` file.

    Parameters
    ----------
    path : path-like
        An ``.npz`` (``np.savez`` or ``np.savez_compressed``) holding ``x_train`` ``(n, ...)``,
        ``y_train`` ``(n,)``, ``x_test`` ``(m, ...)``, ``y_test`` ``(m,)`` and optionally
        ``client_train`` ``(n,)``: the client id ``0 .. N - 1`` of each training row. Other
        arrays in the file are ignored. Object (pickled) arrays are refused.
    scaling : {"none", "standardize"}
        See the module docstring.
    num_classes : int, optional
        Number of classes; default the largest label + 1.

    Returns
    -------
    DatasetSplit
        ``name`` is ``path`` as given; ``source`` is ``{"kind": "npz", "path": <absolute
        path>, "sha256": <hex digest of the file>}``.

    Raises
    ------
    DataError
        A missing or unreadable file, a missing array, or invalid contents.
    ConfigError
        An invalid ``scaling`` or ``num_classes``.
    """
    _check_scaling(scaling)
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{path} does not exist; give the path of an .npz file")
    if not p.is_file():
        raise DataError(f"{path} is not a file; give the path of an .npz file")
    digest = _guarded(path, lambda: sha256_of(p))
    with _open_npz(p, path) as npz:
        arrays = {k: _npz_array(npz, k, path) for k in _inspect(npz, path)}
    absolute = str(p.resolve())
    return _split(
        (
            arrays["x_train"],
            arrays["y_train"],
            arrays["x_test"],
            arrays["y_test"],
            arrays.get("client_train"),
        ),
        num_classes=num_classes,
        scaling=scaling,
        name=os.fspath(path),
        source={"kind": "npz", "path": absolute, "sha256": digest},
        what=f"user data from {p.name}",
    )


def from_tensors(
    x_train,
    y_train,
    x_test,
    y_test,
    client_train=None,
    *,
    num_classes: int | None = None,
    name: str = IN_MEMORY_NAME,
    scaling: str = "none",
) -> DatasetSplit:
    """Build a dataset from tensors or arrays.

    Parameters
    ----------
    x_train, x_test : torch.Tensor or np.ndarray
        Features ``(n, ...)`` and ``(m, ...)`` of the same per-example shape.
    y_train, y_test : torch.Tensor or np.ndarray
        Integer labels ``(n,)`` and ``(m,)``.
    client_train : torch.Tensor or np.ndarray, optional
        Client id ``0 .. N - 1`` of each training row.
    num_classes : int, optional
        Number of classes; default the largest label + 1.
    name : str
        The ``name`` of the result.
    scaling : {"none", "standardize"}
        See the module docstring.

    Returns
    -------
    DatasetSplit
        ``source`` is ``{"kind": "in-memory tensors"}``. The inputs are not modified; the
        result may share memory with float32 CPU inputs when ``scaling="none"``.
    """
    return _split(
        (x_train, y_train, x_test, y_test, client_train),
        num_classes=num_classes,
        scaling=scaling,
        name=name,
        source={"kind": IN_MEMORY_NAME},
        what=f"user data ({name})",
    )


def _item_features(x, where: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "getbands") and hasattr(x, "size"):  # a PIL image: HWC -> CHW
        arr = np.asarray(x)
        return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    arr = np.asarray(x)
    if arr.dtype == object:
        raise DataError(
            f"{where} has features of type {type(x).__name__}; return a tensor, array or PIL "
            "image (e.g. use transform=ToTensor())"
        )
    return arr


def _item_label(y, where: str):
    if isinstance(y, torch.Tensor | np.ndarray):
        if (y.numel() if isinstance(y, torch.Tensor) else y.size) != 1:
            raise DataError(
                f"{where} has a label of shape {tuple(y.shape)}; labels must be single class "
                "indices (one-hot labels: take argmax)"
            )
        return y.item()
    if isinstance(y, int | float | np.generic):
        return y
    raise DataError(
        f"{where} has a label of type {type(y).__name__}; labels must be integer class indices"
    )


def _stack(ds, part: str) -> tuple[np.ndarray, np.ndarray]:
    """Read every item of a map-style dataset once into ``(X, y)`` arrays."""
    try:
        n = len(ds)
    except TypeError as exc:
        raise DataError(
            f"the {part} dataset {type(ds).__name__} has no len(); give a map-style dataset "
            "(len and ds[i] -> (x, y)), or use from_tensors"
        ) from exc
    if n == 0:
        raise DataError(f"the {part} dataset is empty; give at least one example")
    X: np.ndarray | None = None
    y = np.empty(n, dtype=object)
    for i in range(n):
        item = ds[i]
        where = f"{part} item {i}"
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise DataError(
                f"{where} is a {type(item).__name__}, not an (x, y) pair; make __getitem__ "
                "return (features, label)"
            )
        x = _item_features(item[0], where)
        if X is None:
            X = np.empty((n, *x.shape), dtype=np.float32)
            if x.size == 0:
                raise DataError(f"{where} has no features (shape {x.shape}); fix the dataset")
        elif x.shape != X.shape[1:]:
            raise DataError(
                f"{where} has features of shape {x.shape} but item 0 has {X.shape[1:]}; give "
                "every item the same shape (e.g. with a Resize transform)"
            )
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise DataError(
                f"{where} holds {int(np.count_nonzero(~np.isfinite(x)))} non-finite value(s) "
                "(NaN or inf); remove or impute them before loading"
            )
        X[i] = x
        y[i] = _item_label(item[1], where)
    labels = np.array(y.tolist())  # int, float or bool dtype as the labels were
    return X, labels


def from_datasets(
    train,
    test,
    client_train=None,
    *,
    num_classes: int | None = None,
    name: str = IN_MEMORY_NAME,
    scaling: str = "none",
) -> DatasetSplit:
    """Build a dataset from two map-style torch datasets.

    Parameters
    ----------
    train, test : torch.utils.data.Dataset
        ``len(ds)`` and ``ds[i] -> (x, y)``, where ``x`` is a tensor, array or PIL image (all
        items of one shape) and ``y`` an int or a one-element tensor. PIL images become
        channels-first ``(C, H, W)`` arrays with their values unchanged (0..255), like
        ``ToTensor()`` without its division by 255. Each dataset is read once, item by item.
    client_train : torch.Tensor or np.ndarray, optional
        Client id ``0 .. N - 1`` of each training item.
    num_classes : int, optional
        Number of classes; default the largest label + 1.
    name : str
        The ``name`` of the result.
    scaling : {"none", "standardize"}
        See the module docstring.

    Returns
    -------
    DatasetSplit
        ``source`` is ``{"kind": "in-memory tensors"}``.
    """
    _check_scaling(scaling)
    x_train, y_train = _stack(train, "train")
    x_test, y_test = _stack(test, "test")
    return from_tensors(
        x_train,
        y_train,
        x_test,
        y_test,
        client_train,
        num_classes=num_classes,
        name=name,
        scaling=scaling,
    )


_CHECKSUMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def data_checksum(data: DatasetSplit) -> str:
    """SHA-256 of a dataset's arrays (features, labels, client ids), to recognise the same
    data given again in memory (a resumed run refuses other data). Remembered per object:
    a ``DatasetSplit`` is frozen."""
    if data not in _CHECKSUMS:
        _CHECKSUMS[data] = _arrays_checksum(data)
    return _CHECKSUMS[data]


def _arrays_checksum(data: DatasetSplit) -> str:
    h = hashlib.sha256()
    for t in (data.X_train, data.y_train, data.X_test, data.y_test, data.client_train):
        if t is None:
            h.update(b"none")
            continue
        a = t.detach().cpu().contiguous().numpy()
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


_CLIENT_COUNTS: dict[tuple, int | None] = {}


def npz_client_count(path: str | os.PathLike) -> int | None:
    """The number of clients of an ``.npz`` file's ``client_train`` (None without one),
    reading that array alone, once per file (as ``sha256_of``)."""
    key = _file_key(path)
    if key not in _CLIENT_COUNTS:
        _CLIENT_COUNTS[key] = _read_client_count(path)
    return _CLIENT_COUNTS[key]


def _read_client_count(path: str | os.PathLike) -> int | None:
    shown = os.fspath(path)
    with _open_npz(Path(path), shown) as f:
        if "client_train" not in _inspect(f, shown):
            return None
        ids = as_client_ids(_npz_array(f, "client_train", shown), "client_train")
    return int(ids.max()) + 1 if ids.size else None


def rescale(data: DatasetSplit, scaling: str) -> DatasetSplit:
    """``data`` with ``scaling`` applied (``"none"``: unchanged)."""
    if _check_scaling(scaling) == "none":
        return data
    out = from_tensors(
        data.X_train,
        data.y_train,
        data.X_test,
        data.y_test,
        data.client_train,
        num_classes=data.num_classes,
        name=data.name,
        scaling=scaling,
    )
    return out


def save_npz(data: DatasetSplit, path: str | os.PathLike) -> Path:
    """Write ``data`` as an ``.npz`` that ``load_npz`` (and ``--dataset PATH.npz``) reads:
    the way to take data built in Python to the command line or to Flower's clients."""
    arrays = {
        "x_train": data.X_train.numpy(),
        "y_train": data.y_train.numpy(),
        "x_test": data.X_test.numpy(),
        "y_test": data.y_test.numpy(),
    }
    if data.client_train is not None:
        arrays["client_train"] = data.client_train.numpy()
    path = Path(path)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


__all__ = [
    "data_checksum",
    "from_datasets",
    "from_tensors",
    "load_npz",
    "npz_client_count",
    "rescale",
    "save_npz",
    "sha256_of",
]
