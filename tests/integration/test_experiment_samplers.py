"""`fedhmc experiment samplers` at its quick size: every federated sampler in each task's
table, the figures written, the budgets equal, the costs as the page states them, and
Fashion-MNIST skipped in one line where its files are absent."""

import importlib
import json
import math
from pathlib import Path

import pytest

from fedhmc.cli.main import main

samplers = importlib.import_module("fedhmc.experiments.samplers")

FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The quick experiment on the Gaussian and simulated BLR, Fashion-MNIST made absent."""
    out = tmp_path_factory.mktemp("samplers")
    mp = pytest.MonkeyPatch()
    mp.setenv("FEDHMC_CACHE", str(out / "cache"))
    mp.setattr(samplers, "fmnist_available", lambda: False)
    try:
        assert main(["experiment", "samplers", "--quick", "--out", str(out / "run")]) == 0
    finally:
        mp.undo()
    return out / "run"


def test_every_sampler_is_in_each_table_and_the_figures_exist(quick):
    summary = json.loads((quick / "samplers.json").read_text())
    assert summary["budget"] == "quick"
    for task in ("gaussian", "blr"):
        t = summary["tasks"][task]
        assert [r["sampler"] for r in t["rows"]] == list(samplers.SAMPLERS)
        assert all(r["seeds"].endswith("/2") for r in t["rows"])  # diverged runs count
        metric = t["metrics"][0]
        finite = [r for r in t["rows"] if r[metric] is not None and math.isfinite(r[metric])]
        assert len(finite) >= 6, t["rows"]  # nearly every sampler gets somewhere
        assert (quick / f"samplers_{task}.png").stat().st_size > 10_000
    tables = (quick / "samplers_tables.md").read_text()
    for label in samplers.LABELS.values():
        assert f"| {label} |" in tables
    # Fashion-MNIST: skipped, said so once, and no figure.
    assert "not found" in summary["tasks"]["fmnist"]["skipped"]
    assert "Skipped:" in tables and not (quick / "samplers_fmnist.png").exists()


def test_budgets_are_equal_and_costs_are_the_formulas(quick):
    """Each sampler spends at most the budget and more than the budget less one round;
    the measured evaluations and bits of a round are cost_per_round's."""
    from fedhmc.sweep.table import read_csv

    summary = json.loads((quick / "samplers.json").read_text())
    for name in ("gaussian", "blr"):
        task = samplers.task_spec(name, "quick")
        for row in summary["tasks"][name]["rows"]:
            s = row["sampler"]
            own = row["own_value"]
            settings = samplers.sampler_cell_settings(task, s, row["step_size"], own, 1)
            cell = quick / "cells" / samplers.sampler_cell_id(task, s, row["step_size"], own, 1)
            run = json.loads((cell / "summary.json").read_text())
            if run["status"] != "completed":
                continue  # a diverged run stops before its budget
            cost = samplers.cost_per_round(s, settings, task.clients, run["dim"])
            assert row["cost_evals"] == cost["evals"] and row["dim"] == run["dim"]
            history = read_csv(cell / "metrics.csv")
            evals = float(history[-1]["grad_evals"]) / task.chains
            assert task.evals - cost["evals"] < evals <= task.evals + 1e-9, (name, s)
            if s in ("qlsd-pp", "dglmc") or (s == "fahmc-debiased" and len(history) < 2):
                continue  # refreshes, θ₀ in round 1, no anchor yet: not a round's cost
            last = history[-1]
            up = last.get("bits_up")
            up = float(up) if up not in (None, "") else 8 * float(last["bytes_up"])
            assert up / task.chains == cost["bits_up"], (name, s)
            assert 8 * float(last["bytes_down"]) / task.chains == cost["bits_down"], (name, s)
            first = float(history[0]["grad_evals"]) / task.chains
            assert first == pytest.approx(cost["setup_evals"] + cost["evals"]), (name, s)


def test_the_tuning_rule_picks_the_best_point_and_replot_rebuilds(quick, tmp_path):
    import shutil

    from fedhmc.sweep.table import read_csv

    rows = read_csv(quick / "samplers_tuning.csv")
    for task in ("gaussian", "blr"):
        for s in samplers.SAMPLERS:
            mine = [r for r in rows if r["task"] == task and r["sampler"] == s]
            assert sum(1 for r in mine if r["chosen"] in (True, "True")) == 1
    before = json.loads((quick / "samplers.json").read_text())
    copy = tmp_path / "copy"
    shutil.copytree(quick, copy)
    (copy / "samplers_gaussian.png").unlink()
    assert samplers.replot_samplers(copy)  # from the cells: nothing runs
    after = json.loads((copy / "samplers.json").read_text())
    assert after["tasks"]["gaussian"]["rows"] == before["tasks"]["gaussian"]["rows"]
    assert (copy / "samplers_gaussian.png").exists()
    shutil.rmtree(copy / "cells")  # from the curves and the summary alone
    assert samplers.replot_samplers(copy)


@pytest.mark.skipif(
    not (FMNIST / "train-images-idx3-ubyte.gz").exists(),
    reason=f"{FMNIST} not found; install it with `apt-get install dataset-fashion-mnist`",
)
def test_fmnist_task_reports_the_papers_metrics(tmp_path):
    task = samplers.task_spec("fmnist", "quick")
    task = samplers.dataclasses.replace(task, seeds=1)
    info, curves = samplers.build_task(tmp_path, task, 0)
    assert [r["sampler"] for r in info["rows"]] == list(samplers.SAMPLERS)
    fahmc = info["rows"][0]
    assert 0.5 < fahmc["accuracy"] <= 1 and fahmc["nll_sum"] > 0
    assert {"accuracy", "brier", "ece", "nll_sum"} <= set(curves[0])


def test_workers_give_the_same_tables(quick, tmp_path):
    """The Gaussian task with its cells in two processes: the table of one process."""
    task = samplers.task_spec("gaussian", "quick")
    info, _ = samplers.build_task(tmp_path, task, 0, workers=2)
    one = json.loads((quick / "samplers.json").read_text())["tasks"]["gaussian"]["rows"]
    assert json.loads(json.dumps(info["rows"])) == one
