"""``fedhmc plot``: figures from a run's or a sweep's tables."""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from fedhmc.errors import ConfigError
from fedhmc.sweep.table import (
    read_table,
)
from fedhmc.viz.plots import KINDS, default_metric, plot


def add_plot_command(sub) -> None:
    p = sub.add_parser(
        "plot",
        help="plot a run's metrics against rounds, or a sweep's results.csv "
        "(metrics, rounds, versus, rounds-to, rounds2-vs-dim)",
        description="Plot a tidy table from `fedhmc sweep` (results.csv, a sweep directory, or "
        "one run's metrics.csv with config.json beside it); saves PNG and PDF.",
    )
    p.add_argument("table", metavar="RESULTS", help="results.csv, a sweep dir, or metrics.csv")
    p.add_argument(
        "--kind",
        default="metrics",
        choices=KINDS,
        help="figure type (default: metrics, every metric against rounds)",
    )
    p.add_argument("--metric", help="metric column (default: nll_mean, else w2)")
    p.add_argument("--hue", metavar="KEY", help="setting that names the lines (e.g. algorithm)")
    p.add_argument(
        "--x",
        metavar="KEY",
        help="x-axis setting for versus and rounds-to (default: step-size, local-steps)",
    )
    p.add_argument("--threshold", type=float, help="rounds-to, rounds2-vs-dim: the level to reach")
    p.add_argument(
        "--out",
        metavar="FILE_STEM",
        help="output path without extension (default: plot-KIND-METRIC beside the table)",
    )
    p.set_defaults(func=cmd_plot)


def _csv_of(table: Path) -> Path | None:
    """The CSV file that ``read_table`` reads for ``table`` (None: it says why not)."""
    if table.is_dir():
        for name in ("results.csv", "metrics.csv"):
            if (table / name).exists():
                return table / name
        return None
    return table if table.is_file() else None


def check_header(path: Path) -> None:
    """A one-line ``ConfigError`` when the header line of the CSV ``path`` is cut: the file
    ends within it, or its rows hold more fields than it names (every row would be dropped
    as half written, and the table would seem empty)."""
    try:
        with open(path, newline="") as f:
            head = f.read(1 << 16)
            f.seek(0)
            reader = csv.reader(f)
            header = next(reader, None)
            widths = [len(row) for row, _ in zip(reader, range(50), strict=False) if row]
    except (OSError, UnicodeDecodeError, csv.Error):
        return  # read_table says what is wrong with the file
    if header is None:
        return
    fix = "restore the file (a run's metrics.csv: from a copy, or run it again)"
    if "\n" not in head and "\r" not in head:
        raise ConfigError(
            f"the header of {str(path)!r} is cut: the file ends within its first line "
            f"({len(header)} column name{'s' if len(header) != 1 else ''}, no row); {fix}"
        )
    if widths and min(widths) > len(header):
        raise ConfigError(
            f"the header of {str(path)!r} is cut: it names {len(header)} columns (the last "
            f"{header[-1]!r}) where its rows hold {min(widths)} or more; {fix}"
        )


def _check_inputs(args: argparse.Namespace) -> None:
    """One-line refusals of a table that is no file or folder (a device, a fifo: reading
    it would never end) and of a threshold that is not a number."""
    table = Path(args.table)
    if table.exists() and not (table.is_file() or table.is_dir()):
        raise ConfigError(
            f"{args.table} is not a regular file; give results.csv, a sweep folder, or a "
            "run's metrics.csv"
        )
    if args.threshold is not None and not math.isfinite(args.threshold):
        raise ConfigError(f"--threshold must be a finite number, got {args.threshold}")


def cmd_plot(args: argparse.Namespace) -> int:
    _check_inputs(args)
    csv_path = _csv_of(Path(args.table))
    if csv_path is not None:
        check_header(csv_path)
    rows = read_table(args.table)
    table = Path(args.table)
    where = table if table.is_dir() else table.parent
    if args.metric is not None and not any(args.metric in r for r in rows):
        numeric = [k for k, v in rows[-1].items() if isinstance(v, int | float)]
        raise ConfigError(
            f"--metric: no column {args.metric!r} in the table; available: {', '.join(numeric)}"
        )
    metric = args.metric or default_metric(rows)
    name = "plot-metrics" if args.kind == "metrics" else f"plot-{args.kind}-{metric}"
    stem = args.out or str(where / name)
    if args.out is not None:
        from fedhmc.runtime.output import check_out_file

        check_out_file(args.out, example=name, made=True)  # (plot makes its folder)
    paths = plot(
        rows,
        args.kind,
        stem,
        metric=metric,
        hue=args.hue,
        x=args.x,
        threshold=args.threshold,
    )
    for path in paths:
        print(path)
    return 0
