"""Redraw the committed results figures from the committed tables, without running anything.

    python tools/replot_results.py            # every figure below (fedhmc installed)
    python tools/replot_results.py paper-fmnist-K paper-blr-T

Each figure is drawn by the experiment's own plotting function, from the files the
experiment wrote next to it (``*_curves.csv``, ``*.json``, ``*.csv``), so a figure changes
only when the plotting code does (``fedhmc.viz.plots.new_figure`` lays a row of four panels
out on two rows and keeps tick labels apart). ``participation`` first writes its tables
again from the runs committed in its ``cells/`` (each run's totals, as the experiment
writes them).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


def _paper_fmnist(name: str) -> list[Path]:
    from fedhmc.experiments.paper_fmnist import FIGURES, _plot
    from fedhmc.sweep.table import read_csv

    out = RESULTS / name
    stem = out / name.replace("-", "_")
    fig = FIGURES[name]
    curves = read_csv(stem.with_name(stem.name + "_curves.csv"))
    for c in curves:
        c[fig.axis] = int(c[fig.axis])
    _plot(stem, fig, curves)
    return [stem.with_name(stem.name + f"_{x}.png") for x in ("rounds", "evals")]


def _paper_blr(name: str) -> list[Path]:
    from fedhmc.experiments.blr_t import _plot_blr
    from fedhmc.sweep.table import read_csv

    out = RESULTS / name
    summary = json.loads((out / "paper_blr_T.json").read_text())
    curves: dict = {}
    for r in read_csv(out / "paper_blr_T_curves.csv"):
        curves.setdefault((r["protocol"], int(r["T"])), []).append((r["samples"], r["me"]))
    Ts = sorted({T for _, T in curves})
    _plot_blr(out / "paper_blr_T.png", summary, curves, Ts)
    return [out / "paper_blr_T.png"]


_PANEL_TITLES = {
    "fmnist-K": "Fashion-MNIST, 10 iid clients, T = {T}, η = 1e-3 ({budget})",
    "fmnist-T": "Fashion-MNIST, 10 iid clients, K = 10, η = 1e-3 ({budget})",
    "fmnist-cnn": "Fashion-MNIST LeNet-5, 10 iid clients, T = {T}, B = {B} ({budget})",
}
_HUES = {"fmnist-K": "leapfrog-steps", "fmnist-T": "local-steps", "fmnist-cnn": "leapfrog-steps"}


def _metric_panels(name: str) -> list[Path]:
    from fedhmc.experiments._common import _metric_panels as draw
    from fedhmc.sweep.table import read_csv

    out = RESULTS / name
    file = name.replace("-", "_")
    summary = json.loads((out / f"{file}.json").read_text())
    base = summary["base"]
    title = _PANEL_TITLES[name].format(
        T=base.get("local-steps"), B=base.get("batch-size"), budget=summary["budget"]
    )
    rows = read_csv(out / f"{file}.csv")
    with tempfile.TemporaryDirectory() as tmp:  # the PDF it also writes is not committed
        draw(rows, _HUES[name], title, Path(tmp) / file, summary.get("paper_200_rounds"))
        shutil.copy(Path(tmp) / f"{file}.png", out / f"{file}.png")
    return [out / f"{file}.png"]


def _delayed_sgld(name: str) -> list[Path]:
    from fedhmc.experiments.delayed_sgld import _plots
    from fedhmc.sweep.table import read_csv

    out = RESULTS / name
    summary = json.loads((out / "delayed_sgld.json").read_text())
    curves = read_csv(out / "delayed_sgld.csv")
    for q in curves:
        q["workers"] = int(q["workers"])
    scales = sorted(float(c) for c in summary["settings"]["step_sizes"])
    _plots(out, curves, scales, summary["w2_floor"]["mean"], summary["settings"]["eps"])
    return [out / "delayed_sgld_iterations.png", out / "delayed_sgld_wall.png"]


def _versus_eta(name: str) -> list[Path]:
    """The two figures of the step-size sweep, drawn as its page says (``fedhmc plot``)."""
    from fedhmc.sweep.table import read_csv
    from fedhmc.viz.plots import plot

    out = RESULTS / name
    rows = read_csv(out / "results.csv")
    paths = []
    with tempfile.TemporaryDirectory() as tmp:
        for metric in ("nll_mean", "ece"):
            stem = f"{metric.split('_')[0]}_vs_eta"
            plot(
                rows, "versus", Path(tmp) / stem, metric=metric, x="step-size", hue="leapfrog-steps"
            )
            for ext in (".png", ".pdf"):
                if (out / f"{stem}{ext}").exists():
                    shutil.copy(Path(tmp) / f"{stem}{ext}", out / f"{stem}{ext}")
            paths.append(out / f"{stem}.png")
    return paths


def _gaussian_dim(name: str) -> list[Path]:
    from fedhmc.experiments.gaussian_dim import _plot

    out = RESULTS / name
    _plot(out / "gaussian_dim.png", json.loads((out / "gaussian_dim.json").read_text())["rows"])
    return [out / "gaussian_dim.png"]


def _blr_eta(name: str) -> list[Path]:
    """blr-eta and blr-d10 (the same experiment at d = 10)."""
    from fedhmc.experiments.blr_eta import _plot

    out = RESULTS / name
    file = name.replace("-", "_")
    _plot(out / f"{file}.png", json.loads((out / f"{file}.json").read_text()))
    return [out / f"{file}.png"]


def _blr_t(name: str) -> list[Path]:
    from fedhmc.experiments.blr_t import _plot_blr_t
    from fedhmc.sweep.table import read_csv

    out = RESULTS / name
    summary = json.loads((out / "blr_T.json").read_text())
    curves: dict = {}
    for r in read_csv(out / "blr_T_curves.csv"):
        curves.setdefault(r["T"], []).append((r["round"], r["me"]))
    _plot_blr_t(out / "blr_T.png", summary, curves)
    return [out / "blr_T.png"]


def _curves(path: Path, key: str, x: str, y: str) -> dict:
    """A curves table as key → (xs, ys), in the table's order."""
    from fedhmc.sweep.table import read_csv

    curves: dict = {}
    for r in read_csv(path):
        xs, ys = curves.setdefault(r[key], ([], []))
        xs.append(r[x])
        ys.append(r[y])
    return curves


def _stale_gaussian(name: str) -> list[Path]:
    from fedhmc.experiments.stale_gaussian import _plot

    out = RESULTS / name
    rows = json.loads((out / "stale_gaussian.json").read_text())["rows"]
    curves = _curves(out / "stale_gaussian_curves.csv", "tau", "iterations", "mse")
    _plot(out / "stale_gaussian.png", rows, curves)
    return [out / "stale_gaussian.png"]


def _stale_variance(name: str) -> list[Path]:
    from fedhmc.experiments.stale_variance import _plot

    out = RESULTS / name
    curves = _curves(
        out / "stale_variance_curves.csv", "workers", "iterations_per_worker", "variance"
    )
    _plot(out / "stale_variance.png", curves)
    return [out / "stale_variance.png"]


def _debiased_gaussian(name: str) -> list[Path]:
    from fedhmc.experiments.debiased_gaussian import _plot

    out = RESULTS / name
    _plot(
        out / "debiased_gaussian.png",
        json.loads((out / "debiased_gaussian.json").read_text())["rows"],
    )
    return [out / "debiased_gaussian.png"]


def _participation(name: str) -> list[Path]:
    from fedhmc.experiments.participation import replot

    return replot(RESULTS / name)


def _samplers(name: str) -> list[Path]:
    from fedhmc.experiments.samplers import replot_samplers

    return replot_samplers(RESULTS / name)


FIGURES = {
    **{
        n: _paper_fmnist
        for n in (
            "paper-fmnist-K",
            "paper-fmnist-T",
            "paper-fmnist-K-dirichlet",
            "paper-fmnist-T-dirichlet",
            "paper-fmnist-mlp",
        )
    },
    "paper-blr-T": _paper_blr,
    "paper-blr-T-d100": _paper_blr,
    **{n: _metric_panels for n in _PANEL_TITLES},
    "delayed-sgld": _delayed_sgld,
    "fmnist-K-eta": _versus_eta,
    "gaussian-dim": _gaussian_dim,
    "blr-eta": _blr_eta,
    "blr-d10": _blr_eta,
    "blr-T": _blr_t,
    "stale-gaussian": _stale_gaussian,
    "stale-variance": _stale_variance,
    "debiased-gaussian": _debiased_gaussian,
    "participation": _participation,
    "samplers": _samplers,
    "samplers-full": _samplers,  # (fedhmc experiment samplers --full)
}


def main(names: list[str]) -> None:
    for name in names or list(FIGURES):
        for path in FIGURES[name](name):
            print(path.relative_to(ROOT))


if __name__ == "__main__":
    main(sys.argv[1:])
