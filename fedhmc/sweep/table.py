"""A sweep's tidy table (one row per cell and round), summaries over seeds and the choice
of the best step size.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

from fedhmc.errors import ConfigError, loads_json
from fedhmc.runtime.config import RunConfig
from fedhmc.sweep.grid import RUN_ONLY_KEYS

SETTINGS_COLUMNS = ("cell", "status")
"""The table's first columns; every RunConfig key (kebab-case) follows, then the metrics."""


SUMMARY_METRICS = ("accuracy", "nll_mean", "brier", "ece", "w2", "mean_error")
"""The metrics the printed summary shows (those present in the table)."""


HIGHER_IS_BETTER = frozenset({"accuracy"})
"""Metrics where larger is better; every other metric is better when smaller."""


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


def read_csv(path: str | os.PathLike) -> list[dict]:
    """The rows of a CSV table (a run's metrics.csv, a sweep's results.csv), numbers as
    numbers and empty fields as None. A row with fewer or more fields than the header (a line
    half written when its writer was killed) is dropped with a one-line warning."""
    import sys

    rows, dropped = [], []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        for r in reader:
            if (
                None in r
                or any(v is None for v in r.values())
                or any("\0" in v for v in r.values())
            ):
                dropped.append(reader.line_num)
                continue
            rows.append({k: _num(v) for k, v in r.items()})
    if dropped:
        where = "the last row" if len(dropped) == 1 else f"{len(dropped)} rows"
        print(
            f"fedhmc: warning: {path}: dropped {where} (line {', '.join(map(str, dropped))}), "
            "written only in part",
            file=sys.stderr,
        )
    return rows


def cell_rows(cell_dir: Path, cell: str | None = None, config: dict | None = None) -> list[dict]:
    """One run directory's rows: its settings (kebab-case) and each round's metrics.

    A run with no completed round gives one row without metrics, so its status shows.
    """
    cell_dir = Path(cell_dir)
    try:
        config = loads_json((cell_dir / "config.json").read_text())
    except (OSError, ValueError):
        config = config or {}
    try:
        status = loads_json((cell_dir / "summary.json").read_text()).get("status", "unknown")
    except (OSError, ValueError):
        status = "incomplete" if (cell_dir / "metrics.csv").exists() else "missing"
    head = {"cell": cell or cell_dir.name, "status": status}
    head.update({k.replace("_", "-"): v for k, v in config.items() if k not in RUN_ONLY_KEYS[1:]})
    try:
        history = read_csv(cell_dir / "metrics.csv")
    except OSError:
        history = []
    return [{**head, **h} for h in history] or [head]


def build_table(out: str | os.PathLike) -> list[dict]:
    """Rebuild the sweep's tidy table from ``out/sweep.json`` and the cells' files."""
    out = Path(out)
    record = loads_json((out / "sweep.json").read_text())
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
    from fedhmc.runtime.output import atomic_write, write_csv_atomic

    out = Path(out)
    cols = _columns(rows)
    write_csv_atomic(out / "results.csv", rows, cols)
    written = [out / "results.csv"]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return written
    try:
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
        rows = read_csv(path)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"cannot read {str(path)!r} as CSV ({e})") from None
    if not rows:
        raise ConfigError(f"{str(path)!r} has no rows")
    return rows


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
    """Mean and sample standard deviation (n − 1) of ``values``, skipping None and nan.

    The one mean ± sd of fedhmc's tables (sweeps and experiments alike). The standard
    deviation of a single value is undefined: nan, not 0 (format_mean_std shows it as "—");
    with no value at all both are nan.
    """
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not xs:
        return math.nan, math.nan
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def format_mean_std(mean: float, std: float, spec: str = ".4g", std_spec: str = ".2g") -> str:
    """``mean ± std`` as every table prints it (``spec`` and ``std_spec`` are format specs):
    "—" when there is no value, and "mean ± —" when the standard deviation is undefined
    (a single value)."""
    if math.isnan(mean):
        return "—"
    sd = "—" if math.isnan(std) else format(std, std_spec)
    return f"{format(mean, spec)} ± {sd}"


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


def fmt(v) -> str:
    """A value as the tables print it: floats to 4 significant digits, nan (no value, or
    the standard deviation of a single value) as "—"."""
    if isinstance(v, float):
        return "—" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def format_summary(summary: dict) -> str:
    """The summary as an aligned text table, with the best group per metric."""
    keys, metrics, groups = summary["keys"], summary["metrics"], summary["groups"]
    if not groups:
        return "no completed cell to summarise"
    header = [*keys, "seeds", *metrics]
    body = [
        [fmt(g["settings"][k]) for k in keys]
        + [str(g["n"])]
        + [format_mean_std(*g["stats"][m]) for m in metrics]
        for g in groups
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    lines = [
        "final round, mean ± std over seeds (sample std, n − 1; — for one seed):",
        "  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)),
    ]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    for m, i in summary["best"].items():
        g = groups[i]
        where = " ".join(f"{k}={fmt(v)}" for k, v in g["settings"].items()) or "(one group)"
        rule = "lowest" if is_lower_better(m) else "highest"
        lines.append(f"best {m} ({rule}): {where}: {format_mean_std(*g['stats'][m])}")
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
    body = [[fmt(r[c]) for c in cols] for r in sel["selected"]]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


def write_selection(out: str | os.PathLike, sel: dict) -> Path:
    path = Path(out) / "selected.csv"
    cols = list(sel["selected"][0]) if sel["selected"] else [*sel["keys"], "step-size"]
    from fedhmc.runtime.output import write_csv_atomic

    write_csv_atomic(path, sel["selected"], cols)
    return path
