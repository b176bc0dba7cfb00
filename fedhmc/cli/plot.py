"""``fedhmc plot``: figures from a run's or a sweep's tables."""

from __future__ import annotations

import argparse
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


def cmd_plot(args: argparse.Namespace) -> int:
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
