"""Running cells: resumable, one folder per cell, in parallel worker processes.

The one cell runner of fedhmc: ``fedhmc sweep`` (run_sweep) and every experiment that runs
the engine (``fmnist-*``, ``paper-fmnist-*``) run their cells through run_cells. A cell is
a cell id and its ``fedhmc run`` settings; it runs into ``OUT/cells/<cell id>/``. A cell
whose ``summary.json`` says it completed (or diverged) with the same settings is not run
again (pending_cells picks the others), so a stopped sweep or experiment resumes where it
stopped and loses at most the cells in flight.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path

from fedhmc.algorithms import registry
from fedhmc.errors import ConfigError, FedHMCError, RunInterrupted, loads_json
from fedhmc.runtime.config import (
    RunConfig,
    recorded_settings,
    refuse_unused,
    sampler_options,
    unused_settings,
)
from fedhmc.runtime.lock import FolderLock
from fedhmc.runtime.output import mark_folder
from fedhmc.sweep.grid import RUN_ONLY_KEYS, cell_id, expand_grid
from fedhmc.sweep.table import build_table, write_table


def cell_done(cell_dir: str | os.PathLike, settings: dict | RunConfig) -> bool:
    """Whether ``cell_dir`` holds a finished run of ``settings`` (a settings mapping or a
    RunConfig): its summary says completed or diverged, and its config.json describes the
    same computation (same_run_settings; ``out`` and the other run-only keys aside)."""
    cell_dir = Path(cell_dir)
    try:
        summary = loads_json((cell_dir / "summary.json").read_text())
        config = loads_json((cell_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if summary.get("status") not in ("completed", "diverged"):
        return False  # a diverged run is a result too: rerunning it diverges again
    cfg = settings if isinstance(settings, RunConfig) else RunConfig.from_mapping(settings)
    want = json.loads(json.dumps(cfg.resolve().to_dict(), default=str))
    return same_run_settings(config, want)


def pending_cells(out: str | os.PathLike, cells: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The cells of ``cells`` ((cell id, settings) pairs) that ``out/cells/`` does not hold
    finished (cell_done), in their order: the ones run_cells has to run."""
    out = Path(out)
    return [(cid, s) for cid, s in cells if not cell_done(out / "cells" / cid, s)]


def same_run_settings(a: dict, b: dict) -> bool:
    """Whether two config.json dicts describe the same computation.

    A key that one side lacks (a run written before the key existed) counts as that key's
    default: a new setting's default keeps the behaviour runs had before it existed.
    """
    defaults = _field_defaults()
    a = {k: v for k, v in a.items() if k not in RUN_ONLY_KEYS}
    b = {k: v for k, v in b.items() if k not in RUN_ONLY_KEYS}
    for k in set(a) ^ set(b):
        if k in defaults:
            a.setdefault(k, defaults[k])
            b.setdefault(k, defaults[k])
    # What config.json records: the settings that played no part as null, on both sides
    # (after the missing keys are filled, so a key one side lacks is nulled like the other's;
    # a config.json written before the nulling compares the same).
    return recorded_settings(a) == recorded_settings(b)


def _field_defaults() -> dict:
    """RunConfig's field defaults, as config.json writes them."""
    return json.loads(json.dumps(RunConfig().to_dict(), default=str))


def stop_if_interrupted(cid: str, res: dict) -> None:
    """Cells run in this process, one after another: a signal that stopped cell ``cid``
    stops the loop too, so no further cell starts. Its checkpoint is written."""
    if res["status"] == "interrupted":
        raise FedHMCError(
            f"stopped in cell {cid} (its checkpoint is written); "
            "run the same command again to continue"
        )


def run_cell(settings: dict, cell_dir: str, threads: int | str | None = None) -> dict:
    """Run one cell into ``cell_dir``; returns ``{"status": ..., "error": ...}``.

    Top level so that worker processes can run it. Errors do not propagate: a failed
    cell is a result. ``threads`` sets torch's intra-op threads for the run. A cell whose
    settings name no device runs on ``$FEDHMC_DEVICE`` when it is set (what
    ``fedhmc experiment --device`` sets; worker processes inherit it).
    """
    import torch

    if _PARENT is not None and os.getppid() != _PARENT:
        # The sweep (or experiment) that queued this cell is gone: do not start it, or the
        # worker would go on computing cells nobody waits for.
        return {"status": "interrupted", "error": "the process that started the cell is gone"}
    old = torch.get_num_threads()
    if isinstance(threads, int):
        torch.set_num_threads(threads)
    status, error = "completed", ""
    try:
        from fedhmc.runner import run_config
        from fedhmc.runtime.loop import resume_or_replace

        cell = {**settings, "out": cell_dir}
        device = os.environ.get(DEVICE_ENV)
        if device and "device" not in cell:
            cell["device"] = device
        if cell.get("tensorboard"):  # one TensorBoard run per cell
            cell["tensorboard"] = str(Path(cell["tensorboard"]) / Path(cell_dir).name)
        cfg = resume_or_replace(RunConfig.from_mapping(cell))
        run_config(cfg, progress=False, threads=threads or None)
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
        recorded = loads_json((Path(cell_dir) / "summary.json").read_text()).get("status")
    except (OSError, ValueError):
        recorded = None
    if recorded and recorded != "completed":
        status = recorded  # "diverged", "failed"
    return {"status": status, "error": error}


_PARENT: int | None = None
"""In a worker process: the pid of the sweep that started it."""

DEVICE_ENV = "FEDHMC_DEVICE"
"""The environment variable naming the device of cells whose settings name none."""


def _init_worker(threads: int) -> None:
    import torch

    global _PARENT
    _PARENT = os.getppid()
    die_with_parent()
    torch.set_num_threads(threads)


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent dies (whatever kills it), so
    that no worker goes on computing into a cell folder that a rerun would use. The
    SIGTERM makes a running cell checkpoint and stop (see fedhmc.runtime.checkpoint)."""
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


@dataclasses.dataclass(frozen=True)
class CellHooks:
    """What run_cells tells its caller as cells run.

    log
        Where a one-line message for each cell that did not complete goes (through the
        bar when there is one); None: no message.
    on_start, on_done
        Called with the cell id when a cell starts (is queued, with workers), and with the
        cell id and its result when it ends.
    """

    log: Callable[[str], object] | None = None
    on_start: Callable[[str], object] | None = None
    on_done: Callable[[str, dict], object] | None = None


def run_cells(
    out: str | os.PathLike,
    cells: list[tuple[str, dict]],
    *,
    workers: int = 1,
    threads: int | str | None = None,
    desc: str = "cells",
    progress: bool = True,
    hooks: CellHooks = CellHooks(),
) -> dict[str, dict]:
    """Run each cell ((cell id, settings) pairs) into ``out/cells/<cell id>/``.

    Every cell given runs (pending_cells leaves out the finished ones). With ``workers`` 1
    they run in this process one after another, and a cell stopped by a signal stops the
    loop (stop_if_interrupted); with more, in up to ``workers`` spawned processes that die
    with this one. A failed cell is a result, not an error: its status says so.

    Parameters
    ----------
    threads
        torch threads of each cell (run_cell): a number, ``"auto"``, or None for the
        process default (``auto``, as ``fedhmc run``; in a worker process: the number its
        pool was started with).
    desc
        The progress bar's label (a bar over the cells, on a terminal, when ``progress``).
    hooks
        The log and the callbacks at each cell's start and end (CellHooks).

    Returns
    -------
    dict
        Cell id → ``{"status": ..., "error": ...}`` (run_cell's result) of the cells run.
    """
    out = Path(out)
    results: dict[str, dict] = {}
    if not cells:
        return results
    bar = None
    if progress:
        from fedhmc.core.progress import bar as progress_bar

        bar = progress_bar(len(cells), desc, "cell")
    finish = functools.partial(_finish_cell, results, hooks, bar)
    try:
        if workers <= 1:
            for cid, settings in cells:
                if hooks.on_start is not None:
                    hooks.on_start(cid)
                res = run_cell(settings, str(out / "cells" / cid), threads)
                finish(cid, res)
                stop_if_interrupted(cid, res)
        else:
            _run_parallel(out, cells, workers, threads, hooks.on_start, finish)
    finally:
        if bar is not None:
            bar.close()
    return results


def _finish_cell(results: dict, hooks: CellHooks, bar, cid: str, res: dict) -> None:
    """A cell ended: keep its result, call on_done, log it if it did not complete, and
    move the bar."""
    results[cid] = res
    if hooks.on_done is not None:
        hooks.on_done(cid, res)
    if hooks.log is not None and res["status"] != "completed":
        msg = f"cell {cid} {res['status']}: {res.get('error', '')}"
        (bar.write if bar is not None else hooks.log)(msg)
    if bar is not None:
        bar.update(1)


def _run_parallel(out: Path, cells, workers: int, threads, on_start, finish) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=min(workers, len(cells)),
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(threads,),
    )
    try:
        futures = {}
        for cid, settings in cells:
            futures[pool.submit(run_cell, settings, str(out / "cells" / cid), threads)] = cid
            if on_start is not None:
                on_start(cid)
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
    threads: int | str | None = "auto",
    given: Collection[str] = (),
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
    threads
        torch threads of a one-worker sweep: a number, or ``"auto"`` (each cell chooses
        from its size, fedhmc.runtime.threads).
    given
        The settings (RunConfig field names) the user gave for every cell: one that no
        cell would make use of is refused before any cell runs
        (`refuse_unused_in_every_cell`).

    Returns
    -------
    list of dict
        The tidy table's rows (also in ``out/results.csv``).
    """
    lock = FolderLock(out, "a sweep").acquire()  # two sweeps never share a folder
    ok = False
    try:
        rows = _run_sweep(out, grid, base, workers, progress, log, threads, given)
        ok = True
        return rows
    finally:
        lock.release(discard=not ok)  # a refused sweep leaves no empty folder


def _run_sweep(out, grid, base, workers, progress, log, threads, given) -> list[dict]:
    """run_sweep's body, run while the folder's lock is held."""
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
    cells = _sweep_cells(grid, base)
    refuse_unused_in_every_cell(cells, given)  # no option accepted without effect
    try:
        mark_folder(out)  # the folder is fedhmc's from its first file on
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
        if cell_done(out / "cells" / c["id"], c["cfg"]):
            by_id[c["id"]]["status"] = "completed"
        else:
            todo.append(c)
    flower = any(c["cfg"].backend == "flower" for c in cells)
    workers = 1 if flower else min(workers, max(1, len(todo)))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
    record["workers_used"] = workers
    _write_json(out / "sweep.json", record)
    head = f"fedhmc sweep: {len(cells)} cells, skipped {len(cells) - len(todo)} completed cells; "
    if flower:
        log(head + "backend flower: cells run one at a time")
    else:
        log(head + f"running {len(todo)} on {workers} worker(s) × {threads} torch thread(s)")
    _run_recorded(out, record, todo, (workers, threads, progress), log)
    rows = build_table(out)
    write_table(out, rows)
    return rows


def _sweep_cells(grid: dict, base: dict) -> list[dict]:
    """The sweep's cells (id, grid values, settings, resolved config), checked: each one's
    settings resolve, and no two are the same cell."""
    cells = []
    for cell in expand_grid(grid):
        settings = _cell_settings(base, cell)
        try:
            cfg = RunConfig.from_mapping(settings)
            cid = cell_id(settings, cell)
            resolved = cfg.resolve()
        except ConfigError as e:
            desc = " ".join(f"{k}={v}" for k, v in cell.items())
            raise ConfigError(f"cell {desc}: {e}") from None
        cells.append(
            {"id": cid, "cell": cell, "settings": settings, "cfg": cfg, "resolved": resolved}
        )
    _refuse_options_no_cell_has(base, cells)
    ids = [c["id"] for c in cells]
    if len(set(ids)) != len(ids):
        raise ConfigError("the grid repeats a cell (the same settings twice); drop duplicates")
    return cells


def _cell_settings(base: dict, cell: dict) -> dict:
    """A cell's settings: ``base`` (what the sweep gives every cell) and its grid values,
    without the sampler options of ``base`` that the cell's sampler does not have (a
    grid of samplers takes each one's options from one command line)."""
    settings = {**base, **cell}
    algo = registry.find(settings.get("algorithm", registry.DEFAULT_ALGORITHM))
    if algo.module_path is None:
        return settings  # (an unknown name: refused when the cell resolves)
    declared = sampler_options()
    return {
        k: v
        for k, v in settings.items()
        if k in cell or k.replace("-", "_") not in declared or k.replace("-", "_") in algo.own
    }


def _refuse_options_no_cell_has(base: dict, cells: list[dict]) -> None:
    """Refuse, in one line, a sampler option given for every cell that no cell's sampler
    has."""
    declared = sampler_options()
    for key in base:
        name = key.replace("-", "_")
        if name in declared and not any(key in c["settings"] for c in cells):
            names = sorted({str(c["resolved"].algorithm) for c in cells})
            flag = "--" + key.replace("_", "-")
            raise ConfigError(
                f"{flag} is not an option of any sampler of the grid ({', '.join(names)}); "
                f"drop {flag}"
            )


def refuse_unused_in_every_cell(cells: list[dict], given: Collection[str]) -> None:
    """Refuse, in one line, a setting given for every cell (``given``: RunConfig field
    names) that no cell of the grid would make use of: ``fedhmc run``'s rule
    (`fedhmc.runtime.config.refuse_unused`) over the whole grid. A setting that some cells
    use is fine (``--max-staleness`` in a grid of FA-HMC and asynchronous cells)."""
    unused = set(given)
    for c in cells:
        unused &= set(unused_settings(c["resolved"].to_dict()))
    if not unused or not cells:
        return
    key = next(k for k in given if k in unused)
    try:
        refuse_unused(cells[0]["resolved"], {key})
    except ConfigError as e:
        raise ConfigError(
            str(e).replace("this run would make no", "no cell of the grid would make")
        ) from None


def _run_recorded(out: Path, record: dict, todo: list[dict], how: tuple, log) -> None:
    """Run the ``todo`` cells (``how`` = (workers, threads, progress)), keeping each one's
    status in ``record`` and sweep.json (interrupted ones marked so), and the finish time."""
    workers, threads, progress = how
    by_id = {c["id"]: c for c in record["cells"]}

    def started(cid: str) -> None:
        by_id[cid]["status"] = "running"

    def finish(cid: str, res: dict) -> None:
        by_id[cid].update(res)
        _write_json(out / "sweep.json", record)

    try:
        run_cells(
            out,
            [(c["id"], c["settings"]) for c in todo],
            workers=workers,
            threads=threads,
            progress=progress,
            hooks=CellHooks(log=log, on_start=started, on_done=finish),
        )
    except KeyboardInterrupt:
        for c in record["cells"]:
            if c["status"] in ("running", "pending"):
                c["status"] = "interrupted" if c["status"] == "running" else "pending"
        _write_json(out / "sweep.json", record)
        raise
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    _write_json(out / "sweep.json", record)
