"""Where dataset files are looked for, and the on-disk cache.

Files are looked for in this order (first hit wins):

1. the ``data_dir`` argument (the ``--data-dir`` option);
2. the environment variable ``FEDHMC_DATA``;
3. a system directory, for Fashion-MNIST only: ``/usr/share/datasets/fashion-mnist``, where the
   Debian package ``dataset-fashion-mnist`` puts the four IDX ``.gz`` files;
4. the cache directory, ``$FEDHMC_CACHE`` or ``~/.cache/fedhmc``, in torchvision's layout (where
   ``download=True`` puts what it downloads).

When torchvision needs a layout the files are not in (for example gz-compressed IDX files in a
flat directory), the layout is prepared once under ``<cache>/prepared/`` by `prepare_dir`,
atomically: it is built in a temporary folder and renamed into place only when complete.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterable
from pathlib import Path

from fedhmc.errors import DataError

DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
"""Where ``apt-get install dataset-fashion-mnist`` puts the Fashion-MNIST IDX ``.gz`` files."""

_MARKER = ".fedhmc-complete"


def cache_dir() -> Path:
    """Return the cache directory: ``$FEDHMC_CACHE`` if set, else ``~/.cache/fedhmc``."""
    env = os.environ.get("FEDHMC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedhmc"


def download_dir(data_dir: str | os.PathLike | None) -> Path:
    """Where ``--download`` puts a dataset: ``--data-dir`` when given, else the cache."""
    return Path(data_dir).expanduser() if data_dir else cache_dir()


def search_dirs(data_dir: str | os.PathLike | None, system: Iterable[Path] = ()) -> list[Path]:
    """Return the directories to look in, in order: ``data_dir``, ``FEDHMC_DATA``, system, cache.

    Parameters
    ----------
    data_dir : path-like or None
        The directory the user named, if any.
    system : iterable of Path
        System directories for this dataset (the Debian one for Fashion-MNIST).

    Returns
    -------
    list of Path
        Distinct directories in lookup order (they need not exist).
    """
    dirs: list[Path] = []
    if data_dir is not None and str(data_dir) != "":
        dirs.append(Path(data_dir).expanduser())
    env = os.environ.get("FEDHMC_DATA")
    if env:
        dirs.append(Path(env).expanduser())
    dirs.extend(Path(d) for d in system)
    dirs.append(cache_dir())
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def _fingerprint(sources: dict[str, Path]) -> str:
    info = {}
    for name, path in sorted(sources.items()):
        st = path.stat()
        info[name] = [str(path.resolve()), st.st_size, st.st_mtime_ns]
    return json.dumps(info, sort_keys=True)


def _place(src: Path, dest: Path) -> None:
    """Write ``src`` to ``dest``: decompressed if it ends in ``.gz``, else linked or copied."""
    if src.suffix == ".gz":
        try:
            with gzip.open(src, "rb") as fin, open(dest, "wb") as fout:
                shutil.copyfileobj(fin, fout, length=1 << 20)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            msg = str(exc).replace("\n", " ")
            raise DataError(
                f"{src} is corrupt or truncated ({msg}); replace it with a complete copy"
            ) from exc
        return
    try:
        dest.symlink_to(src.resolve())
    except OSError:
        shutil.copyfile(src, dest)


def prepare_dir(kind: str, sources: dict[str, Path], subdir: str) -> Path:
    """Build (once) a directory ``<root>/<subdir>/`` holding ``sources`` under their given names.

    ``.gz`` sources are decompressed; other files are symlinked (or copied). The result lives
    in ``<cache>/prepared/<kind>-<hash of the source folder>/`` and is rebuilt only when the
    sources change (size or modification time). Building happens in a temporary folder that
    is renamed into place at the end, so an interrupted build is never taken as complete.

    Parameters
    ----------
    kind : str
        A label for the folder name, e.g. ``"FashionMNIST"``.
    sources : dict of str to Path
        Target file name -> source file.
    subdir : str
        Relative folder under the root that receives the files, e.g. ``"FashionMNIST/raw"``.

    Returns
    -------
    Path
        The root directory to hand to torchvision.
    """
    folders = sorted({str(p.parent.resolve()) for p in sources.values()})
    key = hashlib.sha1("\n".join(folders).encode()).hexdigest()[:12]
    base = cache_dir() / "prepared"
    root = base / f"{kind}-{key}"
    fingerprint = _fingerprint(sources)
    marker = root / _MARKER
    if marker.is_file() and marker.read_text() == fingerprint:
        return root
    try:
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{kind}-{key}.", dir=base))
    except OSError as exc:
        raise DataError(
            f"cannot write to the cache directory {base} ({exc.strerror}); "
            "set FEDHMC_CACHE to a writable directory"
        ) from exc
    try:
        target = tmp / subdir
        target.mkdir(parents=True)
        for name, src in sources.items():
            _place(src, target / name)
        (tmp / _MARKER).write_text(fingerprint)
        _swap_in(tmp, root, base)
    except OSError as exc:
        # Another process may have finished the same build first; use its copy if complete.
        if not (marker.is_file() and marker.read_text() == fingerprint):
            raise DataError(
                f"cannot prepare {kind} files in the cache directory {base} ({exc}); "
                "free some space or set FEDHMC_CACHE to a writable directory"
            ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _swap_in(tmp: Path, root: Path, base: Path) -> None:
    """Rename the finished folder ``tmp`` to ``root``, moving a stale ``root`` out of the way."""
    if root.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{root.name}.old.", dir=base))
        try:
            os.replace(root, trash / "stale")
        except FileNotFoundError:
            pass
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, root)
