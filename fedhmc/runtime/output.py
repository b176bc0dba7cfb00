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


RUN_FILES = (
    ".lock",
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
    write(tmp)
    os.replace(tmp, path)


_atomic_write = atomic_write


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
    """

    def __init__(
        self,
        out: str | os.PathLike,
        columns: tuple[str, ...],
        keep_rows: list[dict] | None = None,
    ):
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
        self.columns = ("round", *columns, "wall_s", "grad_evals")
        path = self.out / "metrics.csv"
        if keep_rows is not None:
            # Resuming: keep the rows up to the checkpoint's round, drop any after it.
            def write(p: Path) -> None:
                with open(p, "w", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=list(self.columns))
                    w.writeheader()
                    for row in keep_rows:
                        w.writerow({k: row.get(k, "") for k in self.columns})

            _atomic_write(path, write)
            self._csv_file = open_nofollow(path, os.O_WRONLY | os.O_APPEND, binary=False)
            self._csv = csv.DictWriter(self._csv_file, fieldnames=list(self.columns))
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            self._csv_file = open_nofollow(path, flags, binary=False)
            self._csv = csv.DictWriter(self._csv_file, fieldnames=list(self.columns))
            self._csv.writeheader()
        self._csv_file.flush()
        self.samples: list[np.ndarray] = []

    def write_config(self, config: dict) -> None:
        _atomic_write(
            self.out / "config.json",
            lambda p: p.write_text(json.dumps(config, indent=2, default=str) + "\n"),
        )

    def write_row(self, row: dict) -> None:
        self._csv.writerow({k: plain(row.get(k, "")) for k in self.columns})
        self._csv_file.flush()

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

        _atomic_write(self.out / "samples.npy", write)

    def write_summary(self, summary: dict) -> None:
        _atomic_write(
            self.out / "summary.json",
            lambda p: p.write_text(json.dumps(summary, indent=2, default=_jsonable) + "\n"),
        )

    def close(self) -> None:
        if not self._csv_file.closed:
            self._csv_file.close()


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
