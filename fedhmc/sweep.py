"""``fedhmc sweep``: a grid of runs, resumable, in parallel, as one tidy table.

A sweep is a cartesian product of settings (``--grid "step-size=1e-3,3e-3 seed=0,1"`` or
the ``[grid]`` table of a TOML file) on top of fixed base settings (the ``fedhmc run``
options given on the command line, or the file's ``[base]`` table). Every cell runs into
its own directory ``DIR/cells/<cell-id>/`` with the usual ``config.json``, ``metrics.csv``
and ``summary.json``; ``<cell-id>`` is a readable prefix of the cell's grid values and a
short hash of all its settings, so the same cell always lands in the same directory.

A cell whose ``summary.json`` says ``"status": "completed"`` with the same config is not
run again, so a sweep that stops (Ctrl-C, a killed job) resumes where it stopped and loses
at most the cells in flight. A cell that fails (a diverged chain, a bad setting found at
run time) is recorded with its status and the sweep goes on.

At the end the combined table ``DIR/results.csv`` (one row per cell and round, every
setting and every metric as columns) is rebuilt from the cells' files, a summary over
seeds is printed, and with ``--select best-by=METRIC`` the best step size per setting is
picked and written to ``DIR/selected.csv``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import itertools
import json
import math
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from .config import RunConfig
from .errors import ConfigError, FedHMCError, RunInterrupted

SETTINGS_COLUMNS = ("cell", "status")
"""The table's first columns; every RunConfig key (kebab-case) follows, then the metrics."""

SUMMARY_METRICS = ("accuracy", "nll_mean", "brier", "ece", "w2", "mean_error")
"""The metrics the printed summary shows (those present in the table)."""

HIGHER_IS_BETTER = frozenset({"accuracy"})
"""Metrics where larger is better; every other metric is better when smaller."""

NOT_METRICS = frozenset({"round", "samples", "clients", "failed", "ece_bins"})

_ABBREV = {
    "leapfrog-steps": "K",
    "local-steps": "T",
    "step-size": "eta",
    "seed": "s",
    "num-clients": "N",
    "dim": "d",
    "algorithm": "",
}


# ------------------------------------------------------------------------ the grid
def parse_grid(text: str) -> dict[str, list[str]]:
    """Parse ``"KEY=V1,V2 KEY2=V3"`` into ``{"KEY": ["V1", "V2"], "KEY2": ["V3"]}``.

    Keys are checked against :meth:`RunConfig.keys` (snake-case is accepted and turned
    into kebab-case); values stay text and are parsed per cell by
    :meth:`RunConfig.from_mapping`. A value holding a comma (``hidden``) needs the TOML file.

    Raises
    ------
    ConfigError
        On a malformed item, a repeated or unknown key, or an empty value.
    """
    grid: dict[str, list[str]] = {}
    for item in text.split():
        key, sep, values = item.partition("=")
        vals = [v.strip() for v in values.split(",")]
        if not sep or not key.strip() or not values or any(v == "" for v in vals):
            raise ConfigError(
                f"malformed --grid item {item!r}: write KEY=V1,V2,... items separated by "
                'spaces, e.g. --grid "step-size=1e-3,3e-3 seed=0,1"'
            )
        key = _check_key(key.strip(), "--grid")
        if key in grid:
            raise ConfigError(f"--grid names {key!r} twice; give each key once")
        grid[key] = vals
    if not grid:
        raise ConfigError('--grid is empty; give e.g. --grid "step-size=1e-3,3e-3 seed=0,1"')
    return grid


def load_sweep_file(path: str | os.PathLike) -> tuple[dict[str, list], dict]:
    """Read a TOML sweep file: a ``[grid]`` table of lists and an optional ``[base]`` table.

    Returns ``(grid, base)``. A scalar in ``[grid]`` counts as a one-value list.
    """
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ConfigError("--file needs Python ≥ 3.11 (tomllib) or the tomli package") from None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read --file {str(path)!r} ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--file {str(path)!r} is not valid TOML: {e}") from None
    extra = sorted(set(data) - {"grid", "base"})
    if extra:
        raise ConfigError(
            f"--file {str(path)!r} has unknown table(s) {', '.join(extra)}; "
            "only [grid] and [base] are read"
        )
    raw_grid, raw_base = data.get("grid", {}), data.get("base", {})
    if not isinstance(raw_grid, dict) or not isinstance(raw_base, dict) or not raw_grid:
        raise ConfigError(
            f"--file {str(path)!r} needs a [grid] table of lists, e.g. "
            "[grid]\\nstep-size = [1e-3, 3e-3]\\nseed = [0, 1]"
        )
    grid: dict[str, list] = {}
    for key, values in raw_grid.items():
        values = values if isinstance(values, list) else [values]
        if not values:
            raise ConfigError(f"--file: grid key {key!r} has an empty list")
        grid[_check_key(key, "--file [grid]")] = values
    base = {_check_key(k, "--file [base]"): v for k, v in raw_base.items()}
    return grid, base


def _check_key(key: str, where: str) -> str:
    kebab = key.replace("_", "-")
    if kebab not in RunConfig.keys():
        raise ConfigError(f"{where}: unknown key {key!r}; valid: {', '.join(RunConfig.keys())}")
    if kebab == "out":
        raise ConfigError(f"{where}: 'out' cannot be set per cell; give the sweep's --out")
    return kebab


def expand_grid(grid: dict[str, list]) -> list[dict]:
    """The cartesian product of ``grid``, in key order (the last key varies fastest)."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def cell_id(settings: dict, cell: dict) -> str:
    """A stable directory name: the cell's grid values, then a hash of all its settings.

    ``settings`` is the merged base and cell mapping; the hash is taken over the parsed
    config (so ``0.01`` and ``"1e-2"`` give the same cell) without ``out``.
    """
    cfg = RunConfig.from_mapping({k: v for k, v in settings.items() if k != "out"})
    canon = json.dumps({**cfg.to_dict(), "out": None}, sort_keys=True, default=str)
    digest = hashlib.sha1(canon.encode()).hexdigest()[:8]
    parts = []
    for key in cell:
        typed = getattr(cfg, key.replace("-", "_"))
        text = f"{typed:g}" if isinstance(typed, float) else str(typed)
        parts.append(_ABBREV.get(key, key) + text)
    prefix = re.sub(r"[^A-Za-z0-9.+=-]+", "-", "_".join(parts).replace("_", "~"))
    prefix = prefix.replace("~", "_")[:48].strip("-_")
    return f"{prefix}-{digest}" if prefix else digest


# ----------------------------------------------------------------------- the cells
def _cell_done(cell_dir: Path, cfg: RunConfig) -> bool:
    """Whether ``cell_dir`` holds a completed run of ``cfg`` (compared without ``out``)."""
    try:
        summary = json.loads((cell_dir / "summary.json").read_text())
        config = json.loads((cell_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if summary.get("status") != "completed":
        return False
    want = json.loads(json.dumps(cfg.resolve().to_dict(), default=str))
    return same_run_settings(config, want)


RUN_ONLY_KEYS = ("out", "resume", "overwrite", "checkpoint_every")
"""Settings that say how a run is carried out, not what it computes."""


def same_run_settings(a: dict, b: dict) -> bool:
    """Whether two config.json dicts describe the same computation."""
    a = {k: v for k, v in a.items() if k not in RUN_ONLY_KEYS}
    b = {k: v for k, v in b.items() if k not in RUN_ONLY_KEYS}
    return a == b


def run_cell(settings: dict, cell_dir: str, threads: int | None = None) -> dict:
    """Run one cell into ``cell_dir``; returns ``{"status": ..., "error": ...}``.

    Top level so that worker processes can run it. Errors do not propagate: a failed
    cell is a result. ``threads`` sets torch's intra-op threads for the run.
    """
    import torch

    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    status, error = "completed", ""
    try:
        from .engine import prepare, resume_or_replace

        cell = {**settings, "out": cell_dir}
        if cell.get("tensorboard"):  # one TensorBoard run per cell
            cell["tensorboard"] = str(Path(cell["tensorboard"]) / Path(cell_dir).name)
        cfg = resume_or_replace(prepare(RunConfig.from_mapping(cell)))
        if cfg.backend == "flower":
            from fedhmc_server.simulation import run_flower  # lazy: core never imports flwr

            run_flower(cfg, progress=False)
        else:
            from .engine import run

            run(cfg, progress=False)
    except RunInterrupted as e:
        status, error = "interrupted", str(e)
        if _PARENT is not None and os.getppid() != _PARENT:
            os._exit(e.exit_code)  # the sweep is gone: its checkpoint written, stop here
    except FedHMCError as e:
        status, error = "failed", str(e)
    except Exception as e:  # noqa: BLE001 - a failed cell must not stop the sweep
        status, error = "failed", f"{type(e).__name__}: {e}"
    finally:
        torch.set_num_threads(old)
    try:
        recorded = json.loads((Path(cell_dir) / "summary.json").read_text()).get("status")
    except (OSError, ValueError):
        recorded = None
    if recorded and recorded != "completed":
        status = recorded  # "diverged", "failed"
    return {"status": status, "error": error}


_PARENT: int | None = None
"""In a worker process: the pid of the sweep that started it."""


def _init_worker(threads: int) -> None:
    import torch

    global _PARENT
    _PARENT = os.getppid()
    die_with_parent()
    torch.set_num_threads(threads)


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent dies (whatever kills it), so
    that no worker goes on computing into a cell folder that a rerun would use. The
    SIGTERM makes a running cell checkpoint and stop (see :mod:`fedhmc.checkpoint`)."""
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before the request: stop now
            os.kill(os.getpid(), signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - no prctl here
        pass


class FolderLock:
    """An exclusive lock on a sweep or experiment folder (``.lock``), so that two sweeps
    never run into the same cells at once. Released when the process ends, however."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / ".lock"
        self._f = None

    def __enter__(self):
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a+")  # noqa: SIM115
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.seek(0)
            holder = self._f.read().strip() or "another process"
            self._f.close()
            raise ConfigError(
                f"{self.path.parent} is in use by {holder}; wait for it to finish, or stop "
                "it (its cells resume from their checkpoints)"
            ) from None
        self._f.seek(0)
        self._f.truncate()
        self._f.write(f"process {os.getpid()}")
        self._f.flush()
        return self

    def __exit__(self, *exc):
        import fcntl

        if self._f is not None:
            fcntl.flock(self._f, fcntl.LOCK_UN)
            self._f.close()
        return False


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def run_sweep(
    out: str | os.PathLike,
    grid: dict[str, list],
    base: dict | None = None,
    *,
    workers: int = 1,
    progress: bool = True,
    log=print,
) -> list[dict]:
    """Run every cell of ``grid`` (on top of ``base``) into ``out/cells/`` and build the table.

    Parameters
    ----------
    out
        The sweep directory; gets ``sweep.json``, ``results.csv`` and ``cells/``.
    grid
        Key → list of values; the cells are the cartesian product.
    base
        Fixed settings of every cell.
    workers
        Worker processes ("spawn") for the in-process engine; each gets
        ``max(1, cores // workers)`` torch threads. With ``--backend flower`` the cells run
        one at a time in this process.
    progress
        A progress bar over cells (on a terminal).
    log
        Where the one-line messages go.

    Returns
    -------
    list of dict
        The tidy table's rows (also in ``out/results.csv``).
    """
    try:
        lock = FolderLock(Path(out)).__enter__()  # two sweeps never share a folder
    except OSError as e:
        raise ConfigError(f"cannot write to --out {str(out)!r} ({e.strerror or e})") from None
    try:
        return _run_sweep(out, grid, base, workers, progress, log)
    finally:
        lock.__exit__(None, None, None)


def _run_sweep(out, grid, base, workers, progress, log) -> list[dict]:
    """:func:`run_sweep`'s body, run while the folder's lock is held."""
    base = dict(base or {})
    base.pop("out", None)
    clash = sorted(set(grid) & set(base))
    if clash:
        raise ConfigError(
            f"{', '.join(clash)} is both in the grid and a fixed setting; give it once"
        )
    if workers < 1:
        raise ConfigError(f"--workers must be ≥ 1, got {workers}")
    out = Path(out)
    cells = []
    for cell in expand_grid(grid):
        settings = {**base, **cell}
        try:
            cfg = RunConfig.from_mapping(settings)
            cid = cell_id(settings, cell)
            cfg.resolve()
        except ConfigError as e:
            desc = " ".join(f"{k}={v}" for k, v in cell.items())
            raise ConfigError(f"cell {desc}: {e}") from None
        cells.append({"id": cid, "cell": cell, "settings": settings, "cfg": cfg})
    ids = [c["id"] for c in cells]
    if len(set(ids)) != len(ids):
        raise ConfigError("the grid repeats a cell (the same settings twice); drop duplicates")
    try:
        (out / "cells").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot write to --out {str(out)!r} ({e.strerror or e})") from None

    record = {
        "grid": grid,
        "base": base,
        "workers": workers,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cells": [
            {"id": c["id"], "dir": f"cells/{c['id']}", "settings": c["cell"], "status": "pending"}
            for c in cells
        ],
    }
    by_id = {c["id"]: c for c in record["cells"]}
    todo = []
    for c in cells:
        if _cell_done(out / "cells" / c["id"], c["cfg"]):
            by_id[c["id"]]["status"] = "completed"
        else:
            todo.append(c)
    skipped = len(cells) - len(todo)
    flower = any(c["cfg"].backend == "flower" for c in cells)
    cores = os.cpu_count() or 1
    workers = 1 if flower else min(workers, max(1, len(todo)))
    threads = max(1, cores // workers)
    record["workers_used"] = workers
    _write_json(out / "sweep.json", record)
    if flower:
        log(
            f"fedhmc sweep: {len(cells)} cells, skipped {skipped} completed cells; "
            "backend flower: cells run one at a time"
        )
    else:
        log(
            f"fedhmc sweep: {len(cells)} cells, skipped {skipped} completed cells; "
            f"running {len(todo)} on {workers} worker(s) × {threads} torch thread(s)"
        )

    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="cells", unit="cell", disable=None, leave=False)

    def finish(cid: str, res: dict) -> None:
        by_id[cid].update(res)
        _write_json(out / "sweep.json", record)
        if res["status"] != "completed":
            msg = f"cell {cid} {res['status']}: {res.get('error', '')}"
            (bar.write if bar is not None else log)(msg)
        if bar is not None:
            bar.update(1)

    try:
        if workers == 1:
            for c in todo:
                by_id[c["id"]]["status"] = "running"
                res = run_cell(c["settings"], str(out / "cells" / c["id"]), threads)
                finish(c["id"], res)
        else:
            _run_parallel(todo, out, workers, threads, finish, by_id)
    except KeyboardInterrupt:
        for c in record["cells"]:
            if c["status"] in ("running", "pending"):
                c["status"] = "interrupted" if c["status"] == "running" else "pending"
        _write_json(out / "sweep.json", record)
        raise
    finally:
        if bar is not None:
            bar.close()
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    _write_json(out / "sweep.json", record)
    rows = build_table(out)
    write_table(out, rows)
    return rows


def _run_parallel(todo, out: Path, workers: int, threads: int, finish, by_id) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(threads,)
    )
    try:
        futures = {}
        for c in todo:
            fut = pool.submit(run_cell, c["settings"], str(out / "cells" / c["id"]), threads)
            futures[fut] = c["id"]
            by_id[c["id"]]["status"] = "running"
        for fut in as_completed(futures):
            try:
                res = fut.result()
            except Exception as e:  # noqa: BLE001 - a dead worker fails its cell only
                res = {"status": "failed", "error": f"worker died: {type(e).__name__}: {e}"}
            finish(futures[fut], res)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


# ------------------------------------------------------------------------ the table
def _num(v):
    """A CSV field as a number where it is one; ``""`` is None."""
    if v is None or v == "":
        return None
    if not isinstance(v, str):
        return v
    try:
        f = float(v)
    except ValueError:
        return {"True": True, "False": False}.get(v, v)
    low = v.lower()
    if f.is_integer() and "." not in v and "e" not in low and "inf" not in low:
        return int(f)
    return f


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: _num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def cell_rows(cell_dir: Path, cell: str | None = None, config: dict | None = None) -> list[dict]:
    """One run directory's rows: its settings (kebab-case) and each round's metrics.

    A run with no completed round gives one row without metrics, so its status shows.
    """
    cell_dir = Path(cell_dir)
    try:
        config = json.loads((cell_dir / "config.json").read_text())
    except (OSError, ValueError):
        config = config or {}
    try:
        status = json.loads((cell_dir / "summary.json").read_text()).get("status", "unknown")
    except (OSError, ValueError):
        status = "incomplete" if (cell_dir / "metrics.csv").exists() else "missing"
    head = {"cell": cell or cell_dir.name, "status": status}
    head.update({k.replace("_", "-"): v for k, v in config.items() if k not in RUN_ONLY_KEYS[1:]})
    try:
        history = _read_csv(cell_dir / "metrics.csv")
    except OSError:
        history = []
    return [{**head, **h} for h in history] or [head]


def build_table(out: str | os.PathLike) -> list[dict]:
    """Rebuild the sweep's tidy table from ``out/sweep.json`` and the cells' files."""
    out = Path(out)
    record = json.loads((out / "sweep.json").read_text())
    rows: list[dict] = []
    for c in record["cells"]:
        cell_dir = out / c["dir"]
        fallback = RunConfig.from_mapping({**record["base"], **c["settings"]})
        got = cell_rows(cell_dir, c["id"], fallback.to_dict())
        if got[0]["status"] == "missing":
            for r in got:
                r["status"] = c.get("status", "missing")
        rows += got
    return rows


def _columns(rows: list[dict]) -> list[str]:
    cols = [*SETTINGS_COLUMNS, *RunConfig.keys()]
    seen = set(cols)
    for r in rows:
        for k in r:
            if k not in seen:
                seen.add(k)
                cols.append(k)
    return cols


def write_table(out: str | os.PathLike, rows: list[dict]) -> list[Path]:
    """Write ``results.csv`` (and ``results.parquet`` when pyarrow is importable)."""
    out = Path(out)
    cols = _columns(rows)
    tmp = out / "results.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows({k: "" if r.get(k) is None else r.get(k) for k in cols} for r in rows)
    os.replace(tmp, out / "results.csv")
    written = [out / "results.csv"]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return written
    try:
        from .output import atomic_write

        table = pa.Table.from_pylist([{k: r.get(k) for k in cols} for r in rows])
        atomic_write(out / "results.parquet", lambda p: pq.write_table(table, p))
        written.append(out / "results.parquet")
    except (pa.ArrowException, TypeError, ValueError):  # mixed types: the CSV is the record
        pass
    return written


def read_table(path: str | os.PathLike) -> list[dict]:
    """Read a tidy table: a sweep's ``results.csv``, a sweep directory, or one run's
    ``metrics.csv`` (or run directory) with its ``config.json`` beside it."""
    path = Path(path)
    if path.is_dir():
        if (path / "results.csv").exists():
            path = path / "results.csv"
        elif (path / "metrics.csv").exists():
            path = path / "metrics.csv"
        else:
            raise ConfigError(f"{str(path)!r} holds neither results.csv nor metrics.csv")
    if not path.exists():
        raise ConfigError(f"no such file: {str(path)!r}")
    if path.name == "metrics.csv" and (path.parent / "config.json").exists():
        return cell_rows(path.parent)
    try:
        rows = _read_csv(path)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"cannot read {str(path)!r} as CSV ({e})") from None
    if not rows:
        raise ConfigError(f"{str(path)!r} has no rows")
    return rows


# -------------------------------------------------------------------- the summaries
def is_lower_better(metric: str) -> bool:
    return metric not in HIGHER_IS_BETTER


def final_rows(rows: list[dict]) -> list[dict]:
    """Each completed cell's last round (cells without a status column all count)."""
    last: dict = {}
    for r in rows:
        if r.get("status", "completed") != "completed" or r.get("round") is None:
            continue
        key = r.get("cell")
        if key not in last or r["round"] > last[key]["round"]:
            last[key] = r
    return list(last.values())


def varying_keys(rows: list[dict], exclude: Iterable[str] = ()) -> list[str]:
    """The RunConfig keys whose value differs between rows, in RunConfig order."""
    skip = {"out", *exclude}
    keys = []
    for k in RunConfig.keys():
        if k in skip or not rows or k not in rows[0]:
            continue
        if len({json.dumps(r.get(k), default=str) for r in rows}) > 1:
            keys.append(k)
    return keys


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1; nan for one value), skipping None/nan."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not xs:
        return math.nan, math.nan
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def metric_columns(rows: list[dict], candidates: Iterable[str] = SUMMARY_METRICS) -> list[str]:
    return [m for m in candidates if rows and any(r.get(m) is not None for r in rows)]


def summarize(rows: list[dict], metrics: Iterable[str] | None = None) -> dict:
    """Final-round mean ± std over seeds, per group of cells that differ only by ``seed``.

    Returns ``{"keys": [...], "metrics": [...], "groups": [...], "best": {...}}``: each
    group holds its key values, ``n`` (seeds), and ``{metric: (mean, std)}``; ``best`` maps a
    metric to the index of the best group (lowest mean, highest for accuracy).
    """
    finals = final_rows(rows)
    metrics = metric_columns(finals, metrics or SUMMARY_METRICS)
    keys = varying_keys(rows, exclude=("seed",))
    groups: dict[tuple, list[dict]] = {}
    for r in finals:
        groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    out = []
    for gkey in sorted(groups, key=_sort_key):
        members = groups[gkey]
        out.append(
            {
                "settings": dict(zip(keys, gkey, strict=True)),
                "n": len(members),
                "stats": {m: mean_std([r.get(m) for r in members]) for m in metrics},
            }
        )
    best = {}
    for m in metrics:
        scored = [
            (g["stats"][m][0], i) for i, g in enumerate(out) if not math.isnan(g["stats"][m][0])
        ]
        if scored:
            best[m] = (min(scored) if is_lower_better(m) else max(scored))[1]
    return {"keys": keys, "metrics": metrics, "groups": out, "best": best}


def _sort_key(values: tuple) -> tuple:
    return tuple((0, v, "") if isinstance(v, int | float) else (1, 0, str(v)) for v in values)


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def _fmt_ms(mean: float, std: float) -> str:
    if math.isnan(mean):
        return "—"
    return _fmt(mean) if math.isnan(std) else f"{_fmt(mean)} ± {std:.2g}"


def format_summary(summary: dict) -> str:
    """The summary as an aligned text table, with the best group per metric."""
    keys, metrics, groups = summary["keys"], summary["metrics"], summary["groups"]
    if not groups:
        return "no completed cell to summarise"
    header = [*keys, "seeds", *metrics]
    body = [
        [_fmt(g["settings"][k]) for k in keys]
        + [str(g["n"])]
        + [_fmt_ms(*g["stats"][m]) for m in metrics]
        for g in groups
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    lines = [
        "final round, mean ± std over seeds (sample std, n − 1):",
        "  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)),
    ]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    for m, i in summary["best"].items():
        g = groups[i]
        where = " ".join(f"{k}={_fmt(v)}" for k, v in g["settings"].items()) or "(one group)"
        rule = "lowest" if is_lower_better(m) else "highest"
        lines.append(f"best {m} ({rule}): {where}: {_fmt_ms(*g['stats'][m])}")
    return "\n".join(lines)


def select_best(rows: list[dict], metric: str, key: str = "step-size") -> dict:
    """The best ``key`` (step size) per group of the other varying settings.

    Groups are the cells that agree on every varying setting except ``key`` and ``seed``;
    within a group each value of ``key`` is scored by its final-round ``metric`` averaged
    over seeds (completed cells only), and the lowest (highest for accuracy) wins.

    Returns ``{"keys", "metric", "rule", "selected": [rows], "seeds"}``.
    """
    finals = final_rows(rows)
    if not finals:
        raise ConfigError("--select: no completed cell to select from")
    if metric not in finals[0]:
        avail = [k for k in finals[0] if k not in (*SETTINGS_COLUMNS, *RunConfig.keys())]
        raise ConfigError(
            f"--select best-by={metric}: no such metric; available: {', '.join(avail)}"
        )
    keys = varying_keys(rows, exclude=(key, "seed"))
    groups: dict[tuple, dict] = {}
    for r in finals:
        groups.setdefault(tuple(r.get(k) for k in keys), {}).setdefault(r.get(key), []).append(r)
    lower = is_lower_better(metric)
    selected, seeds = [], set()
    for gkey in sorted(groups, key=_sort_key):
        best = None
        for value, members in groups[gkey].items():
            m, s = mean_std([r.get(metric) for r in members])
            seeds.add(len(members))
            if math.isnan(m):
                continue
            if best is None or (m < best[1] if lower else m > best[1]):
                best = (value, m, s, len(members))
        if best is None:
            continue
        row = dict(zip(keys, gkey, strict=True))
        row.update(
            {
                key: best[0],
                "seeds": best[3],
                f"{metric}_mean": best[1],
                f"{metric}_std": best[2],
                "candidates": len(groups[gkey]),
            }
        )
        selected.append(row)
    n = "/".join(str(s) for s in sorted(seeds)) or "0"
    per = f"per ({', '.join(keys)})" if keys else "overall"
    rule = (
        f"best {key} {per} by mean final {metric} over {n} seed(s); "
        f"{'lower' if lower else 'higher'} is better"
    )
    return {"keys": keys, "metric": metric, "rule": rule, "selected": selected}


def format_selection(sel: dict) -> str:
    lines = [sel["rule"] + ":"]
    if not sel["selected"]:
        return lines[0] + " no completed cell"
    cols = list(sel["selected"][0])
    body = [[_fmt(r[c]) for c in cols] for r in sel["selected"]]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


def write_selection(out: str | os.PathLike, sel: dict) -> Path:
    path = Path(out) / "selected.csv"
    cols = list(sel["selected"][0]) if sel["selected"] else [*sel["keys"], "step-size"]
    from .output import write_csv_atomic

    write_csv_atomic(path, sel["selected"], cols)
    return path


# ---------------------------------------------------------------------- the command
def _parse_select(text: str) -> str:
    key, sep, metric = text.partition("=")
    if key.strip() != "best-by" or not sep or not metric.strip():
        raise ConfigError(f"--select must look like best-by=nll_mean, got {text!r}")
    return metric.strip()


def add_sweep_command(sub) -> None:
    from .cli import add_config_options

    p = sub.add_parser(
        "sweep",
        help="run a grid of runs (resumable, parallel) into one tidy results table",
        description="Run the cartesian product of --grid (or --file's [grid]) on top of the "
        "other options, into DIR/cells/<cell-id>/, resuming completed cells; write "
        "DIR/sweep.json and DIR/results.csv and print the final-round mean ± std over seeds.",
    )
    g = p.add_argument_group("sweep")
    g.add_argument(
        "--grid",
        metavar="SPEC",
        help='space-separated KEY=V1,V2,... items, e.g. "leapfrog-steps=1,10 seed=0,1"',
    )
    g.add_argument(
        "--file", metavar="TOML", help="TOML file with a [grid] table of lists and a [base] table"
    )
    g.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    g.add_argument(
        "--select",
        metavar="best-by=METRIC",
        help="pick the best step-size per other setting by the final METRIC averaged over "
        "seeds; writes DIR/selected.csv",
    )
    g.add_argument("--quiet", action="store_true", help="no progress bar and no tables")
    add_config_options(p)
    for action in p._actions:  # --out is the sweep's directory here, not one run's
        if action.dest == "out":
            action.help = "sweep directory (default runs/<time>-sweep); cells go to DIR/cells/"
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from .cli import config_from_args

    metric = _parse_select(args.select) if args.select else None
    grid: dict[str, list] = {}
    base: dict = {}
    if args.file:
        grid, base = load_sweep_file(args.file)
    if args.grid:
        grid.update(parse_grid(args.grid))
    if not grid:
        raise ConfigError('give --grid "KEY=V1,V2 ..." or --file sweep.toml')
    config_from_args(args)  # checks the fixed options' values
    names = {f.replace("-", "_") for f in RunConfig.keys()}
    cli_base = {k.replace("_", "-"): v for k, v in vars(args).items() if k in names}
    out = cli_base.pop("out", None) or os.path.join(
        "runs", f"{time.strftime('%Y%m%d-%H%M%S')}-sweep"
    )
    base = {**{k: v for k, v in base.items() if k not in cli_base}, **cli_base}
    log = (lambda *a, **k: None) if args.quiet else print
    rows = run_sweep(out, grid, base, workers=args.workers, progress=not args.quiet, log=log)
    bad = sorted({(r["cell"], r["status"]) for r in rows if r["status"] != "completed"})
    if not args.quiet:
        print(format_summary(summarize(rows)))
        if bad:
            print(f"{len(bad)} cell(s) not completed: " + ", ".join(f"{c} ({s})" for c, s in bad))
    if metric:
        sel = select_best(rows, metric)
        path = write_selection(out, sel)
        if not args.quiet:
            print(format_selection(sel))
            print(f"selection in {path}")
    if not args.quiet:
        print(f"table in {Path(out) / 'results.csv'}")
    return 0
