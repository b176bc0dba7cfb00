"""The files of a run: config.json, metrics.csv, summary.json and samples.npy.

Every file is valid at every moment: ``metrics.csv`` is appended and flushed one round at
a time, and ``summary.json`` and ``samples.npy`` are written to a temporary name and
renamed, so a run that stops (a diverged chain, Ctrl-C) leaves readable files behind.
The in-process engine and the Flower ServerApp write the same files through this class.

No file is written through a symbolic link planted in the run folder: such a link is
refused in one line (`refuse_links`). ``samples.npy`` (like the checkpoints) is readable
by its owner alone, mode 0600 whatever the umask: draws may reveal the data.
"""

from __future__ import annotations

import csv
import json
import math
import os
import stat
from pathlib import Path

import numpy as np
import torch

from fedhmc.errors import ConfigError


def plain(v):
    """A value as the files hold it: a tensor (on any device) or a NumPy scalar becomes a
    Python number (or a list of them), through the CPU; anything else is returned as is."""
    if isinstance(v, torch.Tensor):
        v = v.detach()
        return v.item() if v.numel() == 1 else v.cpu().tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


LOCK_NAME = ".lock"
"""The lock file of a folder in use (`fedhmc.runtime.lock.FolderLock`)."""

MARKER = ".fedhmc"
"""The file by which fedhmc knows a folder as its own: every run, sweep and experiment
folder holds it from its first file on. A folder that holds anything else and not this
marker is the user's, and fedhmc writes nothing into it (`check_out_folder`)."""

MARKER_TEXT = (
    "fedhmc\nfedhmc writes this folder (a run, a sweep or an experiment): --overwrite "
    "replaces the files it wrote, and none other.\n"
)

RUN_FILES = (
    ".lock",
    MARKER,
    "config.json",
    "metrics.csv",
    "summary.json",
    "samples.npy",
    "checkpoint.pt",
    "checkpoint.prev.pt",
    "posterior.nc",
    "posterior.outdated.nc",
    "staleness.csv",
    "workers.csv",
    "flower.log",
    "sweep.json",
    "results.csv",
    "results.parquet",
    "selected.csv",
)
"""The files fedhmc writes in a run's (or a sweep's) folder; none of them, nor their
``.tmp`` names, may be a symbolic link (`refuse_links`)."""

PRIVATE_MODE = 0o600
"""Checkpoints and draws (``samples.npy``, the ArviZ export) may reveal a run's data: they
are written readable by their owner alone, whatever the umask."""

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _link_refusal(path: Path) -> ConfigError:
    return ConfigError(
        f"{path} is a symbolic link; fedhmc does not follow links inside a run folder "
        f"(the link could make it overwrite another file): remove it (rm {path}) and run again"
    )


def refuse_links(folder: str | os.PathLike, names=RUN_FILES) -> None:
    """A one-line ``ConfigError`` when one of ``names`` (or its ``.tmp`` name) in
    ``folder`` is a symbolic link: fedhmc neither writes nor reads through a link planted
    in a run folder."""
    folder = Path(folder)
    for name in names:
        for path in (folder / name, folder / (name + ".tmp")):
            if path.is_symlink():
                raise _link_refusal(path)


def _head(path: Path, n: int) -> bytes | None:
    """The first ``n`` bytes of the plain file ``path`` (a link is not followed), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)  # a FIFO: no wait
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        return f.read(min(n, st.st_size)) if stat.S_ISREG(st.st_mode) else None


def _is_marker(path: Path) -> bool:
    """Whether ``path`` is fedhmc's marker: a plain file (not a link) that says so."""
    return _head(path, 7) == b"fedhmc\n"


def _is_lock_file(path: Path) -> bool:
    """Whether ``path`` is a lock file of fedhmc's form (``process N``), or one being made."""
    text = _head(path, 8)
    return text is not None and (text == b"" or text.startswith(b"process "))


def foreign_files(folder: str | os.PathLike) -> list[str]:
    """The names in ``folder`` that fedhmc did not write (sorted): none where the folder
    holds fedhmc's `MARKER`, else every entry but a lock file of fedhmc's form."""
    folder = Path(folder)
    if _is_marker(folder / MARKER):
        return []
    names = sorted(p.name for p in folder.iterdir())
    return [n for n in names if not (n == LOCK_NAME and _is_lock_file(folder / n))]


def check_out_folder(folder: str | os.PathLike) -> None:
    """Refuse, in one line, an output folder that fedhmc must not write into: the root
    folder, the user's home, or an existing folder that holds files fedhmc did not write
    (`foreign_files`). A new or empty folder, or one fedhmc marked as its own, passes."""
    path = Path(folder).expanduser()
    where = path.resolve()
    special = {Path(where.anchor): "the root folder"}
    try:
        special[Path.home().resolve()] = "your home folder"
    except (RuntimeError, KeyError):  # no home to be found: none to protect
        pass
    if where in special:
        raise ConfigError(
            f"--out {folder} is {special[where]}; fedhmc writes into a folder of its own: "
            "give a new one, such as --out runs/my-run"
        )
    if not path.is_dir():
        return
    try:
        other = foreign_files(path)
    except OSError as e:
        raise ConfigError(f"cannot read --out {str(folder)!r} ({e.strerror or e})") from None
    if other:
        shown = ", ".join(other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
        raise ConfigError(
            f"{folder} holds files fedhmc did not write ({shown}) and no {MARKER} "
            "marker of fedhmc's, so fedhmc writes nothing there (a run folder of an earlier "
            "fedhmc lacks the marker too): choose a new or empty folder"
        )


def check_out_file(
    path: str | os.PathLike, option: str = "--out", example: str = "out.nc", made: bool = False
) -> Path:
    """``path`` as a file to write, or a one-line refusal: not a folder (nor the root), in
    a folder that exists (or, ``made``, whose folder the writer makes)."""
    p = Path(path).expanduser()
    if p.is_dir() or p.name in ("", ".", ".."):
        raise ConfigError(
            f"{option} {path} is a folder; give the path of a file to write, such as "
            f"{Path(path) / example}"
        )
    if not made and not p.parent.is_dir():
        raise ConfigError(f"{option} {path}: no folder {p.parent}; create it first")
    return p


def mark_folder(folder: str | os.PathLike) -> None:
    """Write fedhmc's `MARKER` into ``folder`` (kept when it is there already)."""
    path = Path(folder) / MARKER
    if _is_marker(path):
        return
    with open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as f:
        f.write(MARKER_TEXT.encode())


def open_nofollow(path: str | os.PathLike, flags: int, mode: int = 0o666, binary=True):
    """``os.open(path, flags | O_NOFOLLOW, mode)`` as a file object (``"wb"``/``"ab"``, or
    text with ``binary=False``): a symbolic link at ``path`` is a one-line ``ConfigError``,
    not a file written through."""
    path = Path(path)
    try:
        fd = os.open(path, flags | _NOFOLLOW, mode)
    except OSError:
        if path.is_symlink():
            raise _link_refusal(path) from None
        raise
    append = flags & os.O_APPEND
    if binary:
        return os.fdopen(fd, "ab" if append else "wb")
    return os.fdopen(fd, "a" if append else "w", newline="")


def open_private(path: str | os.PathLike):
    """``path`` created (or emptied) for writing in binary, mode 0600 whatever the umask,
    without following a symbolic link."""
    f = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
    os.fchmod(f.fileno(), PRIVATE_MODE)  # an existing file keeps its mode otherwise
    return f


def atomic_write(path: str | os.PathLike, write) -> None:
    """Call ``write(tmp)`` on a temporary name beside ``path``, then rename it into place:
    readers see the old file or the new one, never half of one. Whatever was at the
    temporary name (a symbolic link included) is removed first, never written through; the
    rename replaces a link at ``path`` itself rather than following it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:  # (a full disk): no half-written temporary file is left behind
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text))


def write_csv_atomic(path: str | os.PathLike, rows: list[dict], fieldnames=None) -> None:
    """A CSV of ``rows`` (columns: ``fieldnames`` or the first row's keys), atomically."""
    cols = list(fieldnames if fieldnames is not None else (rows[0] if rows else []))

    def write(p: Path) -> None:
        with open(p, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)

    atomic_write(path, write)


class RunWriter:
    """Writes one run's files into ``out``.

    Parameters
    ----------
    out
        Output directory; created if missing. An unwritable directory raises
        `ConfigError` before any work is done.
    columns
        The metrics.csv columns after ``round`` (the evaluator's columns), followed by
        ``wall_s`` and ``grad_evals``.
    written
        Resuming: what the checkpoint says metrics.csv held (`written`), checked by
        `check_metrics_file` before: the file is cut back to it, and the rows go on from
        there (the rows a stopped run wrote after its checkpoint are dropped).
    """

    def __init__(
        self,
        out: str | os.PathLike,
        columns: tuple[str, ...],
        written: dict | None = None,
    ):
        import hashlib

        self.out = Path(out)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            import tempfile

            tempfile.TemporaryFile(dir=self.out).close()  # a fresh name: nothing followed
        except OSError as e:
            raise ConfigError(
                f"cannot write to --out {str(self.out)!r} ({e.strerror or e}); "
                "choose a writable directory"
            ) from None
        refuse_links(self.out)
        mark_folder(self.out)  # the folder is fedhmc's from its first file on
        self.columns = ("round", *columns, "wall_s", "grad_evals")
        path = self.out / "metrics.csv"
        self._sha, self._bytes, self._rows = hashlib.sha256(), 0, 0
        if written is not None:  # resuming: the rows up to the checkpoint's round, as written
            kept = _read_prefix(path, int(written["bytes"]))
            atomic_write(path, lambda p: p.write_bytes(kept))
            self._csv_file = open_nofollow(path, os.O_WRONLY | os.O_APPEND)
            self._sha.update(kept)
            self._bytes, self._rows = len(kept), int(written["rows"])
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            self._csv_file = open_nofollow(path, flags)
            self._emit(self.columns)
            self._rows = 0
        self.samples: list[np.ndarray] = []

    def _emit(self, values) -> None:
        """One CSV line of ``values``, appended, flushed and counted in `written`."""
        import io

        line = io.StringIO()
        csv.writer(line).writerow(values)
        data = line.getvalue().encode()
        self._csv_file.write(data)
        self._csv_file.flush()
        self._sha.update(data)
        self._bytes += len(data)
        self._rows += 1

    def written(self) -> dict:
        """What metrics.csv holds so far, for the checkpoint: its columns, its number of
        rows (the header aside), and the length and SHA-256 of its bytes. A resume checks
        the file against it (`check_metrics_file`)."""
        return {
            "columns": list(self.columns),
            "rows": self._rows,
            "bytes": self._bytes,
            "sha256": self._sha.hexdigest(),
        }

    def write_config(self, config: dict) -> None:
        atomic_write(
            self.out / "config.json",
            lambda p: p.write_text(json.dumps(config, indent=2, default=str) + "\n"),
        )

    def write_row(self, row: dict) -> None:
        self._emit([plain(row.get(k, "")) for k in self.columns])

    def add_sample(self, theta_bar) -> None:
        """Keep a collected global sample, (S, D), for samples.npy."""
        self.samples.append(theta_bar.detach().to("cpu", torch.float32).numpy().copy())

    def write_samples(self) -> None:
        if not self.samples:
            return
        arr = np.stack(self.samples).astype(np.float32)  # (num_samples, chains, d)

        def write(p: Path) -> None:
            with open_private(p) as f:  # the draws may reveal the data: 0600
                np.save(f, arr)

        atomic_write(self.out / "samples.npy", write)

    def write_summary(self, summary: dict) -> None:
        atomic_write(
            self.out / "summary.json",
            lambda p: p.write_text(json.dumps(summary, indent=2, default=_jsonable) + "\n"),
        )

    def close(self) -> None:
        if not self._csv_file.closed:
            self._csv_file.close()


def _read_prefix(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of the plain file ``path`` (shorter if the file is; empty if
    it is missing or not a plain file); a link there is a one-line refusal."""
    if path.is_symlink():
        raise _link_refusal(path)
    return _head(path, max(0, n)) or b""


def _valid_written(written) -> bool:
    """Whether ``written`` is a record of metrics.csv as `RunWriter.written` makes one (a
    checkpoint's header, which its checksum does not cover, could hold anything)."""
    if not isinstance(written, dict):
        return False
    kinds = {"columns": list, "rows": int, "bytes": int, "sha256": str}
    if any(type(written.get(k)) is not t for k, t in kinds.items()):
        return False
    return all(isinstance(c, str) for c in written["columns"]) and written["bytes"] >= 0


def check_metrics_file(out: str | os.PathLike, written: dict | None, round_: int) -> None:
    """Refuse, in one line, to resume the run in ``out`` when its metrics.csv is not what
    its checkpoint (of round ``round_``) says the run wrote (``written``: `RunWriter.written`):
    its header or its rows differ, or it is shorter (emptied, deleted). Rows after the
    checkpoint's (a run stopped between two checkpoints) are allowed: the resume drops them."""
    import hashlib

    path = Path(out) / "metrics.csv"
    fix = "restore it, or start the run again (--overwrite)"
    if not _valid_written(written):
        raise ConfigError(
            f"cannot resume from {str(out)!r}: its checkpoint does not record what metrics.csv "
            "held (it was edited), so a changed file would go unnoticed; start the run again "
            "(--overwrite)"
        )
    data = _read_prefix(path, written["bytes"])
    header = next(csv.reader([data.partition(b"\n")[0].decode(errors="replace")]), [])
    expected = written["columns"]
    if not path.exists() or not data:
        why = "is missing" if not path.exists() else "is empty"
    elif header != expected:
        got, want = ",".join(header)[:120], ",".join(expected)[:120]
        why = f"has the columns {got!r}, not the run's {want!r}"
    elif len(data) < written["bytes"] or hashlib.sha256(data).hexdigest() != written["sha256"]:
        why = f"differs from the {written['rows']} rows the run wrote"
    else:
        return
    raise ConfigError(
        f"cannot resume from {str(out)!r}: its metrics.csv {why} up to round {round_} "
        f"(its checkpoint's); {fix}"
    )


def _jsonable(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (torch.Tensor, np.generic)):
        return plain(x)
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


class TensorBoardLog:
    """Per-round scalars for TensorBoard through torch's own ``SummaryWriter``.

    Every numeric, finite value of a metrics.csv row is logged as ``metrics/<column>`` at
    step = round, with the step size as ``sampler/step_size``; the resolved config is a
    text entry. A resumed run purges the events after the round it continues from, so the
    curves carry no duplicates.
    """

    @staticmethod
    def require():
        """torch's SummaryWriter, or a one-line error naming the extra (checked before a
        run writes anything)."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "--tensorboard needs TensorBoard: pip install 'fedhmc[tensorboard]'"
            ) from None
        return SummaryWriter

    def __init__(self, logdir: str | os.PathLike, config: dict, start_round: int = 1):
        SummaryWriter = self.require()
        try:
            self.writer = SummaryWriter(
                log_dir=str(logdir), purge_step=start_round if start_round > 1 else None
            )
        except OSError as e:
            raise ConfigError(
                f"cannot write to --tensorboard {str(logdir)!r} ({e.strerror or e}); "
                "choose a writable directory"
            ) from None
        self.step_size = float(config.get("step_size") or float("nan"))
        if start_round <= 1:
            text = "    " + json.dumps(config, indent=2, default=str).replace("\n", "\n    ")
            self.writer.add_text("config", text, 0)

    def log(self, row: dict) -> None:
        r = int(plain(row["round"]))
        for k, v in row.items():
            v = plain(v)
            if k == "round" or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if math.isfinite(v):
                self.writer.add_scalar(f"metrics/{k}", v, r)
        if math.isfinite(self.step_size):
            self.writer.add_scalar("sampler/step_size", self.step_size, r)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
