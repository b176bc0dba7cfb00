"""The files of a run: config.json, metrics.csv, summary.json and samples.npy.

Every file is valid at every moment: ``metrics.csv`` is appended and flushed one round at
a time, and ``summary.json`` and ``samples.npy`` are written to a temporary name and
renamed, so a run that stops (a diverged chain, Ctrl-C) leaves readable files behind.
The in-process engine and the Flower ServerApp write the same files through this class.
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


def atomic_write(path: str | os.PathLike, write) -> None:
    """Call ``write(tmp)`` on a temporary name beside ``path``, then rename it into place:
    readers see the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
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
            probe = self.out / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise ConfigError(
                f"cannot write to --out {str(self.out)!r} ({e.strerror or e}); "
                "choose a writable directory"
            ) from None
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
            self._csv_file = open(path, "a", newline="")  # noqa: SIM115
            self._csv = csv.DictWriter(self._csv_file, fieldnames=list(self.columns))
        else:
            self._csv_file = open(path, "w", newline="")  # noqa: SIM115
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
            with open(p, "wb") as f:
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
