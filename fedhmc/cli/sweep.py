"""``fedhmc sweep``: a grid of runs, resumable, in parallel, as one tidy table."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from fedhmc.errors import ConfigError, loads_json
from fedhmc.sweep.cells import run_sweep
from fedhmc.sweep.grid import load_sweep_file, parse_grid
from fedhmc.sweep.table import (
    format_selection,
    format_summary,
    select_best,
    summarize,
    write_selection,
)


def _selectable() -> tuple[str, ...]:
    """The metrics a cell's final row holds, which ``--select best-by`` may name."""
    from fedhmc.runtime.problem import GAUSSIAN_COLUMNS, PREDICTIVE_COLUMNS

    return (*PREDICTIVE_COLUMNS, *GAUSSIAN_COLUMNS, "energy_error", "wall_s", "grad_evals")


def _parse_select(text: str) -> str:
    key, sep, metric = text.partition("=")
    if key.strip() != "best-by" or not sep or not metric.strip():
        raise ConfigError(f"--select must look like best-by=nll_mean, got {text!r}")
    metric = metric.strip()
    if metric not in _selectable():  # now, not after every cell has run
        raise ConfigError(
            f"--select best-by={metric}: no such metric; choose one of {', '.join(_selectable())}"
        )
    return metric


def add_sweep_command(sub) -> None:
    from fedhmc.cli.options import add_config_options

    p = sub.add_parser(
        "sweep",
        help="run a grid of runs (resumable, parallel) into one tidy results table",
        description="Run the cartesian product of --grid (or --file's [grid]) on top of the "
        "other options, into DIR/cells/<cell-id>/, resuming completed cells; write "
        "DIR/sweep.json and DIR/results.csv and print the final-round mean ± std over seeds. "
        "Exit status 1 when a cell failed (a diverged cell is a result, not a failure).",
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
    from fedhmc.cli.options import add_threads_option

    add_threads_option(p)
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedhmc.cli.options import config_from_args, config_values

    metric = _parse_select(args.select) if args.select else None
    grid: dict[str, list] = {}
    base: dict = {}
    if args.file:
        grid, base = load_sweep_file(args.file)
    if args.grid:
        given = parse_grid(args.grid)
        both = sorted(set(given) & set(grid))
        if both:
            raise ConfigError(
                f"--grid {both[0]} is also a grid axis of {args.file}; give each axis in one "
                "place (the file or --grid)"
            )
        grid.update(given)
    if not grid:
        raise ConfigError('give --grid "KEY=V1,V2 ..." or --file sweep.toml')
    config_from_args(args)  # checks the fixed options' values
    cli_base = {k.replace("_", "-"): v for k, v in config_values(args).items()}
    out = cli_base.pop("out", None) or os.path.join(
        "runs", f"{time.strftime('%Y%m%d-%H%M%S')}-sweep"
    )
    base = {**{k: v for k, v in base.items() if k not in cli_base}, **cli_base}
    log = (lambda *a, **k: None) if args.quiet else print
    from fedhmc.core.progress import set_quiet
    from fedhmc.runtime.threads import parse_threads

    threads = parse_threads(args.threads)
    set_quiet(args.quiet)
    rows = run_sweep(
        out,
        grid,
        base,
        workers=args.workers,
        progress=not args.quiet,
        log=log,
        threads=threads,
        given=[k.replace("-", "_") for k in cli_base],  # (--out, the sweep's, is gone)
    )
    bad = sorted({(r["cell"], r["status"]) for r in rows if r["status"] != "completed"})
    if not args.quiet:
        print(format_summary(summarize(rows)))
        if bad:
            print(f"{len(bad)} cell(s) not completed: " + ", ".join(f"{c} ({s})" for c, s in bad))
    failed = report_failed_cells(out)  # on stderr, --quiet or not
    if metric:
        sel = select_best(rows, metric)
        path = write_selection(out, sel)
        if not args.quiet:
            print(format_selection(sel))
            print(f"selection in {path}")
    if not args.quiet:
        print(f"table in {Path(out) / 'results.csv'}")
    return 1 if failed else 0


RESULTS = ("completed", "diverged")
"""Cell statuses that are results: a diverged cell (a step size too large) is one, as its
rerun would diverge again. Any other status (failed, interrupted, ...) is a failed cell."""


def report_failed_cells(out: str | os.PathLike) -> int:
    """The number of the sweep's cells that failed (their status is not in RESULTS), and,
    when there are any, one line on stderr saying how many and where their errors are
    (``out/sweep.json``), with the first one."""
    path = Path(out) / "sweep.json"
    try:
        cells = loads_json(path.read_text())["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0  # run_sweep wrote it; nothing to report without it
    failed = [c for c in cells if c.get("status") not in RESULTS]
    if not failed:
        return 0
    first = failed[0]
    error = " ".join(str(first.get("error") or first.get("status")).split())
    if len(error) > 200:
        error = error[:199] + "…"
    print(
        f"fedhmc sweep: {len(failed)} of {len(cells)} cells failed; each one's error is in "
        f"{path} (the first, cell {first.get('id')}: {error})",
        file=sys.stderr,
    )
    return len(failed)
