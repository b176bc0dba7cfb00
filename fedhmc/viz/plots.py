"""``fedhmc plot``: the papers' figure types from a sweep's tidy table.

Kinds:

``rounds``
    A metric against communication round, one line per setting (``--hue``), with a ±1 std
    band over seeds.
``versus``
    The final-round metric against ``--x`` (e.g. step-size), one line per ``--hue``
    (e.g. algorithm), mean ± std over seeds.
``rounds-to``
    The first round at which the metric reaches ``--threshold`` (falls to or below it;
    rises to or above it for accuracy) against ``--x`` (e.g. local-steps).
``rounds2-vs-dim``
    (rounds to reach ``--threshold``)² against ``dim`` (the paper's Figure 2).

Every figure is saved as PNG and PDF. Lines are the groups of cells that differ only by
``seed`` (and ``--x``); ``--hue`` names the key listed first in each line's label.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

from fedhmc.errors import ConfigError
from fedhmc.sweep.table import (
    _sort_key,
    final_rows,
    is_lower_better,
    mean_std,
    varying_keys,
)

KINDS = ("metrics", "rounds", "versus", "rounds-to", "rounds2-vs-dim")


METRIC_PANELS = ("accuracy", "brier", "ece", "nll_mean", "w2", "mean_error", "energy_error")


DEFAULT_X = {"versus": "step-size", "rounds-to": "local-steps", "rounds2-vs-dim": "dim"}


_DEFAULT_METRICS = ("nll_mean", "w2", "mean_error", "accuracy")


def default_metric(rows: list[dict]) -> str:
    """nll_mean, else w2, mean_error or accuracy: the first column the table has."""
    metric = next((m for m in _DEFAULT_METRICS if rows and m in rows[0]), None)
    if metric is None:
        raise ConfigError(f"give --metric; columns: {', '.join(rows[0]) if rows else 'none'}")
    return metric


WRAP_PANELS = 4
"""A single row of this many panels or more is laid out on two rows."""
MIN_LEGEND_SIZE = 7.0
"""Legend text is at least this many points."""


def _log_ticks(axis) -> None:
    """Labels on a log axis that never crowd: within a decade, a few plain values; within two,
    the decades and 2 and 5 times them; beyond, the decades. No other minor tick is labelled."""
    from matplotlib.ticker import (
        LogFormatterSciNotation,
        LogLocator,
        MaxNLocator,
        NullFormatter,
        ScalarFormatter,
    )

    lo, hi = sorted(abs(v) for v in axis.get_view_interval())
    decades = math.log10(hi / lo) if lo > 0 else math.inf
    if decades < 1:
        axis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))
        fmt = ScalarFormatter(useMathText=True)
        fmt.set_powerlimits((-3, 4))
        axis.set_major_formatter(fmt)
    elif decades < 2:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(LogFormatterSciNotation(labelOnlyBase=False))
    axis.set_minor_formatter(NullFormatter())


@functools.cache
def _readable_figure_class():
    from matplotlib.figure import Figure

    class ReadableFigure(Figure):
        """A Figure whose plots stay readable at the width of a documentation page.

        ``subplots(1, n)`` with n ≥ ``WRAP_PANELS`` lays the panels out on two rows (and
        makes the figure half as wide and twice as tall), returning them in the same order
        and shape as asked; at saving, large or small tick values get a common ×10ⁿ factor
        instead of long labels that run into each other, log axes get labels that do not
        crowd (ticks a plot placed itself with ``set_xticks`` are kept), and legend text is at
        least ``MIN_LEGEND_SIZE`` points.
        """

        wrapped = False

        def subplots(self, nrows=1, ncols=1, *, squeeze=True, **kwargs):
            if nrows != 1 or ncols < WRAP_PANELS:
                return super().subplots(nrows, ncols, squeeze=squeeze, **kwargs)
            self.wrapped = True
            cols = math.ceil(ncols / 2)
            width, height = self.get_size_inches()
            self.set_size_inches(width * cols / ncols, height * 2)
            grid = super().subplots(2, cols, squeeze=False, **kwargs)
            axes = grid.flatten()
            for ax in axes[ncols:]:
                ax.remove()
            axes = axes[:ncols]
            return axes if squeeze else axes.reshape(1, ncols)

        def savefig(self, *args, **kwargs):
            _readable_axes(self)
            if self.wrapped and not getattr(self, "_tidied", False):
                self._tidied = True
                self._legend_below()
            return super().savefig(*args, **kwargs)

        def _legend_below(self):
            """A wrapped figure: the legend of the first panel goes under the panels, where it
            hides no line, and a long title is cut into lines that fit the width."""
            _legend_below_panels(self)

    return ReadableFigure


def _readable_axes(fig) -> None:
    """At saving: large or small tick values get a common ×10ⁿ factor, log axes labels that
    do not crowd (ticks placed with ``set_xticks`` are kept), legends at least
    ``MIN_LEGEND_SIZE`` points."""
    from matplotlib.ticker import FixedLocator, ScalarFormatter

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            fmt = axis.get_major_formatter()
            if type(fmt) is ScalarFormatter:
                fmt.set_powerlimits((-3, 4))
                fmt.set_useMathText(True)
            elif axis.get_scale() == "log" and not isinstance(
                axis.get_major_locator(), FixedLocator
            ):
                _log_ticks(axis)
        legend = ax.get_legend()
        if legend is not None:
            for text in legend.get_texts():
                text.set_fontsize(max(text.get_fontsize(), MIN_LEGEND_SIZE))


def _legend_below_panels(fig) -> None:
    """A wrapped figure's legend under the panels and its title cut into lines that fit."""
    import textwrap

    width, height = fig.get_size_inches()
    title = fig._suptitle
    if title is not None:
        chars = int(width * 72 / (title.get_fontsize() * 0.55))
        title.set_text("\n".join(textwrap.wrap(title.get_text(), chars)))
    bottom = 0.0
    legend = fig.axes[0].get_legend() if fig.axes else None
    if legend is not None:
        handles, labels = fig.axes[0].get_legend_handles_labels()
        legend.remove()
        ncol = min(3, len(labels))
        size = MIN_LEGEND_SIZE + 0.5
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=size, frameon=False)
        rows = math.ceil(len(labels) / ncol)
        bottom = (rows * size * 1.7 + 14) / 72 / height
    fig.tight_layout(rect=(0, bottom, 1, 1))


def new_figure(width: float = 6.0, height: float = 4.0):
    """A matplotlib Figure on the Agg canvas: no display, no global pyplot state, so safe in
    worker processes and tests. Every figure fedhmc draws starts here; a row of four panels
    or more is laid out on two rows, so that the figure stays readable on a page."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _readable_figure_class()(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _need(rows: list[dict], *cols: str | None) -> None:
    have = list(rows[0])
    for c in cols:
        if c is not None and c not in have:
            raise ConfigError(f"no column {c!r} in the table; available: {', '.join(have)}")


def _lines(rows: list[dict], hue: str | None, x: str | None) -> dict[tuple, list[dict]]:
    """Rows grouped by line: ``hue`` first, then every other varying setting but seed, x."""
    keys = varying_keys(rows, exclude=("seed", *(k for k in (hue, x) if k)))
    if hue:
        keys = [hue, *keys]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        label = tuple((k, r.get(k)) for k in keys)
        groups.setdefault(label, []).append(r)
    return {k: groups[k] for k in sorted(groups, key=lambda t: _sort_key(tuple(v for _, v in t)))}


def _label(key: tuple) -> str:
    return ", ".join(f"{k} = {_fmt(v)}" for k, v in key) or "all cells"


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _by_cell(rows: list[dict]) -> dict:
    cells: dict = {}
    for r in rows:
        cells.setdefault(r.get("cell"), []).append(r)
    return cells


def rounds_to(cell: list[dict], metric: str, threshold: float) -> float:
    """The first round at which ``metric`` reaches ``threshold`` in one cell (nan: never)."""
    lower = is_lower_better(metric)
    for r in sorted(cell, key=lambda r: r["round"]):
        v = r.get(metric)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        if (v <= threshold) if lower else (v >= threshold):
            return float(r["round"])
    return math.nan


def _spans_decade(values: list) -> bool:
    vals = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return bool(vals) and min(vals) > 0 and max(vals) / min(vals) > 10


def _log_x(ax, xs: list) -> None:
    if _spans_decade(xs):
        ax.set_xscale("log")


def plot(
    rows: list[dict],
    kind: str,
    out_stem: str | os.PathLike,
    *,
    metric: str | None = None,
    hue: str | None = None,
    x: str | None = None,
    threshold: float | None = None,
) -> list[Path]:
    """Draw one figure of ``kind`` from the tidy ``rows``; returns the PNG and PDF paths.

    Raises
    ------
    ConfigError
        On an unknown kind, a missing column, or a missing ``threshold``.
    """
    if kind not in KINDS:
        raise ConfigError(f"--kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if not rows:
        raise ConfigError("the table has no rows")
    if kind == "metrics":
        return plot_metrics(rows, out_stem, hue=hue)
    metric = metric or default_metric(rows)
    if kind == "rounds":
        x = None
    else:
        x = "dim" if kind == "rounds2-vs-dim" else (x or DEFAULT_X[kind])
    rows = _plottable_rows(rows, kind, metric, (hue, x), threshold)
    fig = new_figure()
    ax = fig.add_subplot()
    if kind == "rounds":
        _draw_rounds(ax, rows, metric, hue)
    else:
        _draw_versus(ax, rows, kind, metric, (hue, x), threshold)
    if len(ax.get_lines()) > 1 or hue:
        ax.legend(fontsize=7)
    return _save(fig, out_stem)


def _plottable_rows(rows: list[dict], kind: str, metric: str, hue_x: tuple, threshold):
    """``rows`` checked for ``plot`` (the columns it needs, a threshold where the kind needs
    one, a non-empty ``x``) and kept to those with a round (of completed or diverged cells
    when the table has a status)."""
    hue, x = hue_x
    _need(rows, "round", metric, hue, x)
    if kind in ("rounds-to", "rounds2-vs-dim") and threshold is None:
        raise ConfigError(f"--kind {kind} needs --threshold (the level {metric} must reach)")
    if x is not None and all(r.get(x) is None for r in rows):
        raise ConfigError(f"column {x!r} is empty in the table; choose another --x")
    rows = [r for r in rows if r.get("round") is not None]
    if "status" in (rows[0] if rows else {}):
        rows = [r for r in rows if r["status"] in ("completed", "diverged")]
    if not rows:
        raise ConfigError("the table has no completed cell with metrics")
    return rows


def _draw_rounds(ax, rows: list[dict], metric: str, hue: str | None) -> None:
    """``--kind rounds``: ``metric`` against round, a line per setting with a ±1 std band."""
    from matplotlib.ticker import MaxNLocator

    seeds = len({r.get("seed") for r in rows})
    band = "±1 std over seeds" if seeds > 1 else "one seed"
    for key, sel in _lines(rows, hue, None).items():
        per_round: dict = {}
        for r in sel:
            per_round.setdefault(r["round"], []).append(r.get(metric))
        rs = sorted(per_round)
        stats = [mean_std(per_round[t]) for t in rs]
        means = [m for m, _ in stats]
        stds = [0.0 if math.isnan(s) else s for _, s in stats]
        (line,) = ax.plot(rs, means, label=_label(key))
        ax.fill_between(
            rs,
            [m - s for m, s in zip(means, stds, strict=True)],
            [m + s for m, s in zip(means, stds, strict=True)],
            color=line.get_color(),
            alpha=0.2,
            lw=0,
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("communication round")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} against round ({band})", fontsize=10)


def _draw_versus(ax, rows: list[dict], kind: str, metric: str, hue_x: tuple, threshold):
    """``--kind versus``, ``rounds-to`` or ``rounds2-vs-dim``: the final metric, or the
    rounds to reach ``threshold`` (squared for rounds2-vs-dim), against ``x``, mean ± std
    over seeds, a line per setting."""
    hue, x = hue_x
    missing, all_y = [], []
    for key, sel in _lines(rows, hue, x).items():
        per_x = _values_per_x(sel, kind, metric, x, threshold, missing)
        xs = sorted((v for v in per_x if v is not None), key=lambda v: _sort_key((v,)))
        stats = [mean_std(per_x[v]) for v in xs]
        all_y += [m for m, _ in stats]
        ax.errorbar(
            xs,
            [m for m, _ in stats],
            yerr=[0.0 if math.isnan(s) else s for _, s in stats],
            fmt="o-",
            capsize=3,
            label=_label(key),
        )
        _log_x(ax, xs)
    if _spans_decade(all_y):  # e.g. an NLL that blows up at large step sizes
        ax.set_yscale("log")
    ax.set_xlabel(x)
    if kind == "versus":
        what = f"final {metric}"
    else:
        what = f"rounds to {metric} = {threshold:g}"
        what = f"({what})²" if kind == "rounds2-vs-dim" else what
    ax.set_ylabel(what)
    note = f"\n{len(missing)} cell(s) never reach it (left out)" if missing else ""
    ax.set_title(f"{what} against {x} (mean ± std over seeds){note}", fontsize=9)


def _values_per_x(sel: list[dict], kind: str, metric: str, x: str, threshold, missing: list):
    """One line's values by ``x``: the final metric of each cell (``versus``) or its rounds
    to reach ``threshold`` (squared for rounds2-vs-dim); cells that never reach it are
    appended to ``missing``."""
    per_x: dict = {}
    if kind == "versus":
        for r in final_rows(sel):
            per_x.setdefault(r.get(x), []).append(r.get(metric))
        return per_x
    for cell in _by_cell(sel).values():
        n = rounds_to(cell, metric, threshold)
        if math.isnan(n):
            missing.append(cell[0].get("cell"))
        per_x.setdefault(cell[0].get(x), []).append(n**2 if kind == "rounds2-vs-dim" else n)
    return per_x


def plot_metrics(rows: list[dict], out_stem, *, hue: str | None = None) -> list[Path]:
    """Every metric of the table against rounds, one panel each (the default of
    ``fedhmc plot RUN_DIR``): accuracy, Brier, ECE, NLL, or W₂ and mean error, and the
    leapfrog's energy error, with a line per ``hue`` value (mean ± sd over seeds)."""
    rows = [r for r in rows if r.get("round") is not None]
    present = [
        m
        for m in METRIC_PANELS
        if any(isinstance(r.get(m), int | float) and math.isfinite(r[m]) for r in rows)
    ]
    if not present:
        raise ConfigError("the table has no metric column to plot against rounds")
    cols = min(3, len(present))
    nrows = math.ceil(len(present) / cols)
    fig = new_figure()
    fig.set_size_inches(4.2 * cols, 3.0 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False)
    lines = _lines(rows, hue, None)
    for ax, metric in zip(axes.flat, present, strict=False):
        for key, sel in lines.items():
            per_round: dict = {}
            for r in sel:
                v = r.get(metric)
                if isinstance(v, int | float) and math.isfinite(v):
                    per_round.setdefault(r["round"], []).append(v)
            rs = sorted(per_round)
            ax.plot(rs, [mean_std(per_round[t])[0] for t in rs], label=_label(key))
        ax.set_xlabel("communication round")
        ax.set_title(metric, fontsize=10)
        if metric in ("energy_error", "w2", "mean_error") and _spans_decade(
            [r.get(metric) for r in rows]
        ):
            ax.set_yscale("log")
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    if len(lines) > 1 or hue:
        axes.flat[0].legend(fontsize=7)
    return _save(fig, out_stem)


def _save(fig, out_stem) -> list[Path]:
    fig.tight_layout()
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [out_stem.with_name(out_stem.name + ext) for ext in (".png", ".pdf")]
    try:
        fig.savefig(paths[0], dpi=120)
        fig.savefig(paths[1])
    except OSError as e:
        raise ConfigError(f"cannot write {str(paths[0])!r} ({e.strerror or e})") from None
    return paths
