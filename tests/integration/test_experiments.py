"""`fedhmc experiment`: the exact transient law behind gaussian-dim, and quick runs."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhmc.algorithms import fahmc
from fedhmc.analysis.gaussian import fahmc_gaussian_stationary, fahmc_gaussian_transient
from fedhmc.cli.main import main
from fedhmc.models.targets import hetero_gaussian

Z = 5.0


def test_transient_law_tends_to_the_stationary_law_and_matches_the_sampler():
    target = hetero_gaussian(4, 3, dtype=torch.float64)
    args = (target.means, target.variances, target.weights, 0.05, 5, 4, 0.5)
    ms, vs = fahmc_gaussian_transient(*args, rounds=400, theta0=2.0, grad_noise=1.0)
    m, v, _ = fahmc_gaussian_stationary(*args, grad_noise=1.0)
    assert ms[-1] == pytest_approx(m) and vs[-1] == pytest_approx(v)
    # The sampler, from θ̄_0 = 2, follows the exact per-round mean and variance.
    chains, s = 2000, fahmc.Settings(0.05, 5, 4, rho=0.5, grad_noise=1.0)
    state = fahmc.init(torch.full((chains, 3), 2.0, dtype=torch.float64), s)
    for r in range(1, 6):
        state, _ = fahmc.step(0, state, target, s)
        x = state.position.flatten()
        assert abs(float(x.mean()) - ms[r - 1]) < Z * math.sqrt(vs[r - 1] / x.numel())
        assert abs(float(x.var()) - vs[r - 1]) < Z * vs[r - 1] * math.sqrt(2 / (x.numel() - 1))


def pytest_approx(x):
    return pytest.approx(x, rel=1e-9)


def test_gaussian_dim_quick(tmp_path):
    assert main(["experiment", "gaussian-dim", "--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gaussian_dim.json").read_text())["rows"]
    rounds = np.array([r["rounds"] for r in rows], dtype=float)
    dims = np.array([r["dim"] for r in rows], dtype=float)
    assert np.all(np.diff(rounds) > 0)  # more rounds in higher dimension
    # Between √d and d: the paper's √d, times the log of the starting distance.
    growth = np.log(rounds[-1] / rounds[0]) / np.log(dims[-1] / dims[0])
    assert 0.45 < growth < 0.75, growth
    assert rows[0]["max_dev_se"] < Z  # the sampler follows the exact law
    assert (tmp_path / "gaussian_dim.png").stat().st_size > 1000


FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(
    not (FMNIST / "train-images-idx3-ubyte.gz").exists(),
    reason=f"{FMNIST} not found; install it with `apt-get install dataset-fashion-mnist`",
)
def test_fmnist_k_quick_writes_and_resumes(tmp_path):
    assert main(["experiment", "fmnist-K", "--quick", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "fmnist_K.json").read_text())
    assert [r["leapfrog-steps"] for r in summary["rows"]] == [1, 10]
    assert all(0.5 < r["accuracy"] <= 1.0 for r in summary["rows"])  # it learns
    for ext in ("png", "pdf", "csv"):
        assert (tmp_path / f"fmnist_K.{ext}").stat().st_size > 500
    stamp = (tmp_path / "cells" / "leapfrog-steps=10" / "metrics.csv").stat().st_mtime_ns
    assert main(["experiment", "fmnist-K", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "cells" / "leapfrog-steps=10" / "metrics.csv").stat().st_mtime_ns == stamp


def test_full_and_quick_exclude_each_other(tmp_path, capsys):
    assert main(["experiment", "gaussian-dim", "--quick", "--full", "--out", str(tmp_path)]) == 2
    assert "--full" in capsys.readouterr().err


def test_blr_eta_quick_caches_its_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHMC_CACHE", str(tmp_path / "cache"))
    assert main(["experiment", "blr-eta", "--quick", "--out", str(tmp_path / "a")]) == 0
    summary = json.loads((tmp_path / "a" / "blr_eta.json").read_text())
    assert {r["algorithm"] for r in summary["rows"]} == {"fahmc", "fald"}
    assert all(r["me"] > 0 and math.isfinite(r["me"]) for r in summary["rows"])
    assert 0.5 < summary["reference"]["accept_rate"] < 1.0
    cached = list((tmp_path / "cache" / "reference").glob("*.npy"))
    assert len(cached) == 1
    stamp = cached[0].stat().st_mtime_ns
    from fedhmc.experiments.blr import blr_reference
    from fedhmc.runtime.config import RunConfig

    cfg = RunConfig(dataset="blr-synthetic", dim=20, num_clients=20, partition="iid").resolve()
    draws, info = blr_reference(
        cfg, chains=4, warmup=100, samples=50, cache=tmp_path / "cache" / "reference"
    )
    assert draws.shape == (200, 42) and info == summary["reference"]
    assert cached[0].stat().st_mtime_ns == stamp  # it came from the cache
    assert (tmp_path / "a" / "blr_eta.png").stat().st_size > 1000


def test_missing_data_is_one_line_naming_the_data_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FEDHMC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDHMC_DATA", raising=False)
    where = tmp_path / "empty"  # a folder without the files
    where.mkdir()
    exp = tmp_path / "exp"
    args = ["experiment", "kmnist", "--quick", "--data-dir", str(where), "--out", str(exp)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(where) in err[0] and "--download" in err[0]
    assert not exp.exists()  # refused: the folder it made, and its marker, are gone
    # A folder that does not exist is named as such, before anything is written.
    out = tmp_path / "out"
    args = [
        "experiment",
        "kmnist",
        "--quick",
        "--data-dir",
        str(tmp_path / "no"),
        "--out",
        str(out),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such folder" in err[0] and not out.exists()


def test_rounds_to_reach():
    from fedhmc.experiments.blr_t import rounds_to_reach

    assert rounds_to_reach([(1, 0.5), (2, 0.3), (3, 0.2), (4, 0.25)], 0.3) == 2
    assert rounds_to_reach([(1, 0.5), (2, 0.4)], 0.3) is None
    assert rounds_to_reach([(1, 0.1)], 0.3) == 1
    assert rounds_to_reach([(100, 0.5), (103, 0.2)], 0.3) == 103  # rounds, not positions


def test_evaluation_rounds_are_every_round_then_geometric():
    from fedhmc.experiments.blr_t import evaluation_rounds

    assert evaluation_rounds(7) == [1, 2, 3, 4, 5, 6, 7]
    long = evaluation_rounds(5000)
    assert long[:100] == list(range(1, 101)) and long[-1] == 5000
    assert all(b > a for a, b in zip(long, long[1:], strict=False))
    gaps = [b / a for a, b in zip(long[100:], long[101:-1], strict=False)]
    assert max(gaps) < 1.03 and len(long) < 400  # O(log) evaluations, each within ~2 %


def test_blr_t_quick_writes_rounds_to_reach_against_T(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHMC_CACHE", str(tmp_path / "cache"))
    assert main(["experiment", "blr-T", "--quick", "--out", str(tmp_path / "t")]) == 0
    summary = json.loads((tmp_path / "t" / "blr_T.json").read_text())
    rows = summary["rows"]
    assert [r["T"] for r in rows] == [1, 10]
    assert rows[0]["rounds_run"] == 20 and rows[1]["rounds_run"] == 2
    eps = summary["epsilons"]
    assert eps == sorted(eps) and eps[0] >= min(r["me_min"] for r in rows)
    # The T that reached the lowest ME reaches every ε, at most as late as it ran.
    best = min(rows, key=lambda r: r["me_min"])
    assert all(1 <= best[f"rounds_eps{i}"] <= best["rounds_run"] for i in range(len(eps)))
    assert (tmp_path / "t" / "blr_T.png").stat().st_size > 1000
    with open(tmp_path / "t" / "blr_T_curves.csv") as f:
        curves: dict = {}
        for r in csv.DictReader(f):
            curves.setdefault(int(r["T"]), []).append((int(r["round"]), float(r["me"])))
    # The reported rounds are those of the recorded curves.
    from fedhmc.experiments.blr_t import rounds_to_reach

    for row in rows:
        for i, e in enumerate(eps):
            assert row[f"rounds_eps{i}"] == rounds_to_reach(curves[row["T"]], e)
    # From θ̄ = 0 the chains move towards the posterior: T = 1's online ME falls over its
    # 20 rounds, and one round of T = 10 (10 local iterations) is far closer than one of
    # T = 1. (Measured 0.94 → 0.55 and 0.39 against 0.94; a chain that does not move, or
    # an ME against the wrong reference, fails both.)
    assert curves[1][-1][1] < 0.8 * curves[1][0][1]
    assert curves[10][0][1] < 0.6 * curves[1][0][1]


def test_paper_figure_quick_tunes_runs_seeds_and_resumes(tmp_path, capsys):
    from fedhmc.experiments.paper_fmnist import FIGURES, budget_figure, cell_settings, select_eta

    out = tmp_path / "p"
    assert main(["experiment", "paper-fmnist-K", "--quick", "--out", str(out)]) == 0
    summary = json.loads((out / "paper_fmnist_K.json").read_text())
    fig = budget_figure(FIGURES["paper-fmnist-K"], "quick")
    rows = summary["rows"]
    assert {r["protocol"] for r in rows} == {"authors", "algorithm3"}
    assert len(rows) == 2 * len(fig.values)
    for r in rows:
        sel = select_eta(out, fig, r["protocol"], r["K"])
        # The chosen η is the tuning cell with the lowest final NLL.
        tried = [t for t in sel["tried"] if t["nll_sum"] is not None]
        assert r["eta"] == min(tried, key=lambda t: t["nll_sum"])["eta"]
        assert r["seeds"] == fig.seeds
        assert r["ece_bins"] == (20 if r["protocol"] == "authors" else 15)
        # The seeds' mean is the mean of the cells' final values.
        finals = [
            json.loads(
                (
                    out / "cells" / f"{r['protocol']}_K={r['K']}_seed={s}" / "summary.json"
                ).read_text()
            )["final"]["nll_sum"]
            for s in range(fig.seeds)
        ]
        assert r["nll_sum"] == pytest.approx(sum(finals) / len(finals))
        config = json.loads(
            (out / "cells" / f"{r['protocol']}_K={r['K']}_seed=0" / "config.json").read_text()
        )
        assert config["protocol"] == r["protocol"]
        # The same leapfrog steps under both protocols (to within one round).
        per_round = config["local_steps"] * (
            config["leapfrog_steps"] if r["protocol"] == "algorithm3" else 1
        )
        assert abs(config["rounds"] * per_round - fig.rounds * fig.T) < per_round
    assert "| authors |" in (out / "paper_fmnist_K.md").read_text()
    assert (out / "paper_fmnist_K_rounds.png").exists()
    # Resume: a second call runs nothing (every cell completed) and gives the same table.
    before = {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("metrics.csv")}
    assert main(["experiment", "paper-fmnist-K", "--quick", "--out", str(out)]) == 0
    after = {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("metrics.csv")}
    assert before == after
    assert json.loads((out / "paper_fmnist_K.json").read_text())["rows"] == rows
    s = cell_settings(fig, "algorithm3", 10, 1e-3, 0, 200)
    assert s["local-steps"] == 1 and s["rounds"] == 200 * 4 // 10


def test_paper_blr_samples_are_the_engines_and_skipping_changes_nothing(tmp_path):
    from fedhmc.experiments.blr_t import authors_blr_samples
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.engine import run
    from fedhmc.runtime.loop import sampler_settings
    from fedhmc.runtime.problem import build_problem

    cfg = RunConfig(
        dataset="blr-synthetic",
        dim=4,
        num_clients=4,
        partition="iid",
        protocol="authors",
        leapfrog_steps=5,
        local_steps=3,
        step_size=0.05,
        grad_noise=2.0,
        chains=2,
        rounds=4 * 5,
        save_samples=True,
        out=str(tmp_path / "r"),
    )
    res = run(cfg, progress=False)
    assert res.history[-1]["samples"] == 4 * 2  # one per outer iteration (K rounds) and chain
    engine = torch.as_tensor(np.load(tmp_path / "r" / "samples.npy"))
    settings = sampler_settings(res.config)
    assert settings.restart_trajectories and settings.fresh_gradients and settings.leapfrog_sync
    target = build_problem(res.config).target
    theta0 = torch.zeros(2, target.dim)
    for skip in (False, True):
        x = authors_blr_samples(target, settings, theta0, res.config.seed, 4, skip=skip)
        assert torch.equal(x, engine)


@pytest.mark.slow  # an experiment preset end to end
@pytest.mark.slow
def test_paper_blr_t_quick(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHMC_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "b"
    assert main(["experiment", "paper-blr-T", "--quick", "--out", str(out)]) == 0
    summary = json.loads((out / "paper_blr_T.json").read_text())
    rows = summary["rows"]
    assert {r["protocol"] for r in rows} == {"authors", "algorithm3"}
    for r in rows:
        if r["protocol"] == "authors" and r["outer_eps3"] is not None:
            assert r["allreduce_eps3"] == 10 * r["outer_eps3"]  # K = 10 in the quick check
    assert len(summary["parity"]["rows"]) == 2 * 2
    assert (out / "paper_blr_T.png").exists()


@pytest.mark.parametrize("best,start", [(2e-5, None), (5e-4, 1e-5), (2e-7, 1e-5), (1e-6, 1e-6)])
def test_eta_descent_finds_the_grid_minimum_with_few_cells(tmp_path, monkeypatch, best, start):
    from fedhmc.experiments import paper_fmnist as paper

    fig = paper.FIGURES["paper-fmnist-K"]
    ran = []

    def fake_run(out, cells, workers, desc):
        for cid, settings in cells:
            ran.append(settings["step-size"])
            d = out / "cells" / cid
            d.mkdir(parents=True)
            nll = 1000 + math.log(settings["step-size"] / best) ** 2
            status = "diverged" if settings["step-size"] > 2e-4 else "completed"
            final = {"nll_sum": nll} if status == "completed" else {}
            (d / "summary.json").write_text(json.dumps({"status": status, "final": final}))

    monkeypatch.setattr(paper, "_run_missing", fake_run)
    paper.tune_eta(tmp_path, fig, "authors", 10, 0, 1, start)
    sel = paper.select_eta(tmp_path, fig, "authors", 10)
    want = best if best <= 2e-4 else 2e-4  # the largest step that does not diverge
    assert sel["eta"] == want
    assert len(ran) == len(set(ran)) and len(ran) < len(fig.grid_authors)


def test_paper_table_counts_diverged_seeds_and_footnotes_only_what_it_marks():
    from fedhmc.experiments.paper_fmnist import markdown_table
    from fedhmc.sweep.table import mean_std

    row = {
        "protocol": "authors",
        "T": 1,
        "K": 10,
        "local_steps": 1,
        "local_steps_unit": "leapfrog steps",
        "rounds": 200,
        "eta": 5e-5,
        "eta_at_grid_edge": False,
        "seeds": 4,
        "diverged_seeds": 1,
        "grad_evals": 4000,
        "ece_bins": 20,
        **{m: 1.0 for m in ("accuracy", "brier", "ece", "nll_sum")},
        **{f"{m}_sd": 0.0 for m in ("accuracy", "brier", "ece", "nll_sum")},
    }
    summary = {
        "title": "t",
        "budget": "full",
        "paper": None,
        "rows": [row],
        "figure": {"axis": "T", "rounds": 200, "tune_rounds": 40},
    }
    text = markdown_table(summary)
    assert "| 4 (+1 diverged) |" in text
    assert "edge of the grid" not in text
    text = markdown_table({**summary, "rows": [{**row, "eta_at_grid_edge": True}]})
    assert "5e-05* |" in text and "edge of the grid" in text
    # One seed: its sd is undefined (nan, as mean_std gives it), shown as "—", never "± 0".
    _, sd = mean_std([1.0])
    assert math.isnan(sd)
    single = {**row, "seeds": 1, "diverged_seeds": 0}
    single.update({f"{m}_sd": sd for m in ("accuracy", "brier", "ece", "nll_sum")})
    one = markdown_table({**summary, "rows": [single]})
    assert "| 1.0000 ± — | 1.0000 ± — | 1.0000 ± — (20) | 1 ± — |" in one and "± 0" not in one


def test_paper_table_row_read_off_axes_has_no_nll_and_counts_the_figures_seeds():
    from fedhmc.experiments.paper_fmnist import FIGURES, markdown_table

    summary = {
        "title": "t",
        "budget": "full",
        "paper": FIGURES["paper-fmnist-mlp"].paper,
        "rows": [],
        # a reduced budget runs 2 seeds: the paper row still counts the paper's own runs
        "figure": {"axis": "K", "rounds": 200, "tune_rounds": 40, "seeds": 2},
    }
    last = markdown_table(summary).strip().splitlines()[-1]
    assert last.startswith("| paper (best, read off its axes) |")
    assert "| 1 | 200 |" in last and "0.899" in last and last.endswith("| — |")
    summary = {**summary, "paper": FIGURES["paper-fmnist-K"].paper}
    last = markdown_table(summary).strip().splitlines()[-1]
    assert last.startswith("| paper (best) |") and last.endswith("| 4,332 |")


def test_experiment_csv_has_every_rows_key_as_a_column(tmp_path):
    from fedhmc.experiments._common import write_csv

    write_csv(tmp_path / "t.csv", [{"a": 1, "b": 2.5}, {"a": 3, "c": None}])
    with open(tmp_path / "t.csv") as f:
        assert list(csv.reader(f)) == [["a", "b", "c"], ["1", "2.5", ""], ["3", "", ""]]


def test_every_engine_experiment_runs_its_cells_through_sweep_cells():
    # One cell runner: no experiment runs the engine itself or reaches into sweep.cells'
    # private helpers.
    import fedhmc

    root = Path(fedhmc.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "from fedhmc.sweep.cells import _" not in text, path
        assert "cells._" not in text, path
        if path.parent.name == "experiments":
            assert "resume_or_replace" not in text and "engine import run" not in text, path


def test_paper_figure_neighbour_eta_runs_the_best_row_at_the_smaller_eta(tmp_path, monkeypatch):
    from fedhmc.experiments import paper_fmnist as paper

    quick = paper.budget_figure(paper.FIGURES["paper-fmnist-K"], "quick")
    fig = paper.replace(quick, values=quick.values[:1], grid_authors=(1e-2, 1e-3, 1e-4))
    monkeypatch.setattr(paper, "budget_figure", lambda f, b: fig)
    out = tmp_path / "p"
    summary = paper.paper_figure(
        "paper-fmnist-K", out, quick=True, protocols=("authors",), neighbour_eta=True
    )
    rows = [r for r in summary["rows"] if r["protocol"] == "authors"]
    tuned = summary["tuning"]["authors K=1"]["eta"]
    eta = paper.smaller_neighbour(fig.grid_authors, tuned)
    assert eta is not None and eta < tuned
    # Both rows of the setting, the tuned one first; the other from its own seed cells.
    assert [r["eta"] for r in rows] == [tuned, eta]
    finals = []
    for s in range(fig.seeds):
        d = out / "cells" / f"authors_K=1_eta={eta:g}_seed={s}"
        config = json.loads((d / "config.json").read_text())
        assert (config["step_size"], config["seed"], config["rounds"]) == (eta, s, fig.rounds)
        finals.append(json.loads((d / "summary.json").read_text())["final"]["nll_sum"])
    assert rows[1]["seeds"] == fig.seeds
    assert rows[1]["nll_sum"] == pytest.approx(sum(finals) / len(finals))
    assert "†" in (out / "paper_fmnist_K.md").read_text()
    # Resume: nothing runs again; without the option the table still shows both rows.
    before = {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("metrics.csv")}
    again = paper.paper_figure("paper-fmnist-K", out, quick=True, protocols=("authors",))
    assert before == {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("metrics.csv")}
    assert [r["eta"] for r in again["rows"] if r["protocol"] == "authors"] == [tuned, eta]


@pytest.mark.slow  # an experiment preset end to end
def test_participation_quick_writes_both_parts_and_resumes(tmp_path):
    from fedhmc.experiments.participation import PARTICIPATION_BUDGETS, replot
    from fedhmc.sweep.table import read_csv

    out = tmp_path / "p"
    assert main(["experiment", "participation", "--quick", "--out", str(out)]) == 0
    _, N, Ss, client_rounds, _ = PARTICIPATION_BUDGETS["quick"]
    rows = read_csv(out / "participation.csv")
    for algorithm in ("fahmc", "fald"):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        assert {(r["S"], r["participation"]) for r in mine} == {
            (S, p) for S in Ss for p in ("weighted", "uniform", "normalized")
        }
        for r in mine:
            assert r["rounds"] == client_rounds // r["S"] and r["status"] == "completed"
            assert 0 < r["accuracy"] <= 1 and r["grad_evals"] > 0
        # With S = N, uniform and normalized are full participation: one run, both rows.
        full = [r for r in mine if r["S"] == N and r["participation"] != "weighted"]
        assert full[0]["nll_sum"] == full[1]["nll_sum"]
        assert not list((out / "cells").glob(f"{algorithm}_S{N}_uniform_*"))
    assert (rows[0]["K"], [r for r in rows if r["algorithm"] == "fald"][0]["K"]) == (10, 1)
    gauss = read_csv(out / "participation_gaussian.csv")
    assert {r["scheme"] for r in gauss} == {"weighted", "uniform", "normalized"}
    assert all(r["var"] > 0 and r["w2"] >= 0 for r in gauss if r["diverged_round"] in ("", None))
    # A rerun reads the finished cells back; the figures redraw from the files alone.
    stamp = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/metrics.csv")}
    assert main(["experiment", "participation", "--quick", "--out", str(out)]) == 0
    assert stamp == {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/metrics.csv")}
    for png in replot(out):
        assert png.stat().st_size > 10_000
