"""``fedhmc plot``: every kind from a small table, and one-line errors."""

from __future__ import annotations

import csv
import json
import math

import pytest

from fedhmc.cli.main import main
from fedhmc.errors import ConfigError
from fedhmc.viz.plots import KINDS, rounds_to


def _table(path, rows):
    cols = list(rows[0])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture
def results(tmp_path):
    """A hand-made sweep table: algorithm × step-size × local-steps × dim × seed, 6 rounds;
    ``w2`` decays geometrically with a rate that depends on the settings."""
    rows = []
    for alg in ("fahmc", "fald"):
        for eta in (0.001, 0.01, 0.1):
            for t in (1, 10):
                for dim in (2, 20):
                    for seed in (0, 1):
                        cell = f"{alg}-{eta}-{t}-{dim}-{seed}"
                        rate = 0.5 + 0.3 * (alg == "fald") + 0.01 * seed - 0.1 * (t == 10)
                        for r in range(1, 7):
                            rows.append(
                                {
                                    "cell": cell,
                                    "status": "completed",
                                    "algorithm": alg,
                                    "step-size": eta,
                                    "local-steps": t,
                                    "dim": dim,
                                    "seed": seed,
                                    "round": r,
                                    "w2": dim * rate**r,
                                    "nll_mean": 1 + eta + rate**r,
                                }
                            )
    return _table(tmp_path / "results.csv", rows)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_writes_png_and_pdf(results, tmp_path, capsys, kind):
    stem = tmp_path / "figs" / kind
    argv = ["plot", str(results), "--kind", kind, "--out", str(stem), "--hue", "algorithm"]
    if kind in ("rounds-to", "rounds2-vs-dim"):
        argv += ["--metric", "w2", "--threshold", "0.5"]
    assert main(argv) == 0
    printed = capsys.readouterr().out.split()
    for ext in (".png", ".pdf"):
        path = stem.with_name(kind + ext)
        assert str(path) in printed and path.stat().st_size > 1000
    assert stem.with_name(kind + ".png").read_bytes()[:4] == b"\x89PNG"
    assert stem.with_name(kind + ".pdf").read_bytes()[:4] == b"%PDF"


def test_default_output_beside_the_table_and_single_run(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    _table(run / "metrics.csv", [{"round": r, "nll_mean": 2.0 / r} for r in range(1, 4)])
    (run / "config.json").write_text(json.dumps({"step_size": 0.01, "seed": 0}))
    (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert main(["plot", str(run / "metrics.csv"), "--kind", "rounds"]) == 0
    assert (run / "plot-rounds-nll_mean.png").stat().st_size > 0
    assert (run / "plot-rounds-nll_mean.pdf").stat().st_size > 0


def test_plot_run_dir_without_kind_draws_every_metric_against_rounds(tmp_path, capsys):
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.engine import run

    out = tmp_path / "run"
    run(RunConfig(rounds=3, local_steps=2, out=str(out)), progress=False)
    assert main(["plot", str(out)]) == 0
    png = out / "plot-metrics.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and (out / "plot-metrics.pdf").stat().st_size > 0
    from fedhmc.sweep.table import read_table
    from fedhmc.viz.plots import plot_metrics

    fig_paths = plot_metrics(read_table(out), tmp_path / "m")
    assert fig_paths[0].exists()
    with pytest.raises(ConfigError, match="no metric column"):
        plot_metrics([{"round": 1, "other": 1.0}], tmp_path / "none")


def test_rounds_to():
    cell = [{"round": r, "w2": 1.0 / r, "accuracy": 0.1 * r} for r in range(1, 6)]
    assert rounds_to(cell, "w2", 0.3) == 4
    assert math.isnan(rounds_to(cell, "w2", 0.01))
    assert rounds_to(cell, "accuracy", 0.3) == 3  # higher is better: reaches from below


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--kind", "rounds", "--metric", "nope"], "no column 'nope' in the table; available:"),
        (["--kind", "versus", "--x", "rho"], "no column 'rho'"),
        (["--kind", "rounds", "--hue", "K"], "no column 'K'"),
        (["--kind", "rounds-to", "--metric", "w2"], "needs --threshold"),
    ],
)
def test_bad_input_exits_2_with_one_line(results, tmp_path, capsys, extra, needle):
    assert main(["plot", str(results), *extra, "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedhmc plot: error:") and needle in err


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "none.csv"), "--kind", "rounds"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_row_of_four_panels_is_laid_out_on_two_rows(tmp_path):
    from fedhmc.viz.plots import new_figure

    fig = new_figure(13, 3.4)
    axes = fig.subplots(1, 4)
    assert len(axes) == 4 and len(fig.axes) == 4
    assert tuple(fig.get_size_inches()) == (6.5, 6.8)
    rows = sorted({round(ax.get_position().y0, 3) for ax in axes})
    assert len(rows) == 2
    for i, ax in enumerate(axes):
        ax.plot([0, 100_000, 200_000], [1, 2, 3 + i], label=f"line {i}")
        ax.set_yscale("log" if i % 2 else "linear")
    axes[0].legend(fontsize=5)
    fig.suptitle("a long title " * 10)
    fig.savefig(tmp_path / "f.png")
    # The legend moved under the panels, its text legible; large ticks got a ×10ⁿ factor.
    assert axes[0].get_legend() is None and fig.legends
    assert min(t.get_fontsize() for t in fig.legends[0].get_texts()) >= 7
    assert "\n" in fig._suptitle.get_text()
    assert axes[0].xaxis.get_offset_text().get_text()  # ticks 0, 1, 2 and ×10⁵
    assert fig.subplots(1, 2).shape == (2,)  # short rows are left alone
