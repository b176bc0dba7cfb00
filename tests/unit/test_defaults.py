"""One default everywhere, a first line that says what runs, and results files that say
what the runs did."""

import csv
import json
import struct
from pathlib import Path

import pytest

from fedhmc.runtime.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
PARTICIPATION = ROOT / "docs" / "results" / "participation"

# ----------------------------------------------------------------------- the first line


def test_the_headline_names_the_model_chains_and_participation():
    line = RunConfig(chains=4, clients_per_round=3).resolve().headline()
    assert line.startswith("digits, logistic, fahmc, 4 chains, ")
    assert "3 of 10 clients a round (normalized)" in line and "K=10 T=10" in line
    every = RunConfig(model="mlp", hidden="8").resolve().headline()
    assert "mlp, fahmc, 1 chain, all 10 clients every round" in every
    weighted = RunConfig(clients_per_round=2, participation="weighted").resolve().headline()
    assert "2 of 10 clients a round (weighted)" in weighted
    sgld = RunConfig(algorithm="sgld").resolve().headline()
    assert "sgld, 1 chain, the pooled data" in sgld and "h=" in sgld and "ρ" not in sgld
    gauss = RunConfig(dataset="gaussian-hetero", chains=2).resolve().headline()
    assert gauss.startswith("gaussian-hetero, fahmc, 2 chains")  # no model: none named


def test_fedhmc_run_opens_with_the_headline(cli, tmp_path):
    code, out, err = cli("run", "--rounds", "2", "--chains", "2", "--clients-per-round", "4",
                         "--out", tmp_path / "r")  # fmt: skip
    assert code == 0, err
    first = out.splitlines()[0]
    assert first == (
        "fedhmc run: digits, logistic, fahmc, 2 chains, 4 of 10 clients a round "
        "(normalized), K=10 T=10 η=0.01 ρ=1"
    )


def test_the_report_keeps_two_significant_digits_of_a_slow_rate(capsys):
    import torch

    from fedhmc.cli.options import print_final_table
    from fedhmc.runtime.loop import RunResult

    cfg = RunConfig(rounds=2, out="runs/x").resolve()
    summary = {"rounds_completed": 2, "grad_evals_per_s": 3.4149, "bytes_total": 0}
    print_final_table(RunResult(cfg, torch.zeros(1, 1), [{"round": 2}], summary))
    rate = [x for x in capsys.readouterr().out.splitlines() if "grad evals/s" in x]
    assert rate and rate[0].split()[-1] == "3.4"


# --------------------------------------------------------- the committed results files


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", head[16:24])


def test_participation_grad_evals_are_each_runs_total():
    """participation.csv holds each run's gradient evaluations (summary.json's total), not
    the sum of metrics.csv's running totals over the rounds."""
    from fedhmc.experiments.participation import _cells

    summary = json.loads((PARTICIPATION / "participation.json").read_text())
    seed = json.loads((PARTICIPATION / "participation_gaussian.json").read_text())["settings"]
    ids = {
        (s["algorithm"], s["clients-per-round"], label, s["seed"]): cid
        for cid, s, labels in _cells(summary["budget"], int(seed["seed"]))
        for label in labels
    }
    with open(PARTICIPATION / "participation.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows
    for r in rows:
        cid = ids[(r["algorithm"], int(r["S"]), r["participation"], int(r["seed"]))]
        cell = json.loads((PARTICIPATION / "cells" / cid / "summary.json").read_text())
        assert int(r["grad_evals"]) == cell["grad_evals"], cid
    # FA-HMC, S = 5 drawn without replacement: 5 clients × T(K + 1) = 10 × 11 a round, 400 rounds
    full = [
        r for r in rows if (r["algorithm"], r["S"], r["participation"]) == ("fahmc", "5", "uniform")
    ]
    assert full and all(int(r["grad_evals"]) == 5 * 10 * 11 * 400 for r in full)


def test_participation_rebuilds_its_table_from_the_cells(tmp_path):
    import shutil

    from fedhmc.experiments.participation import rebuild_tables

    out = tmp_path / "participation"
    shutil.copytree(PARTICIPATION, out)
    broken = (out / "participation.csv").read_text().replace(",220000,", ",44110000,")
    (out / "participation.csv").write_text(broken)
    assert rebuild_tables(out)
    assert (out / "participation.csv").read_text() == (
        PARTICIPATION / "participation.csv"
    ).read_text()
    shutil.rmtree(next((out / "cells").iterdir()))  # a run missing: nothing is rewritten
    (out / "participation.csv").write_text(broken)
    assert not rebuild_tables(out)
    assert (out / "participation.csv").read_text() == broken


@pytest.mark.parametrize("name", ["participation.png", "participation_gaussian.png"])
def test_participation_figures_are_drawn_at_the_width_a_page_shows(name):
    width, _ = _png_size(PARTICIPATION / name)
    assert width <= 700, f"{name} is {width} px wide; a page shows it at 688 px"


# ------------------------------------------- the benchmark finds data where fedhmc does


def _fake_fmnist(folder: Path) -> Path:
    from fedhmc_datasets.mnist import IDX_FILES

    folder.mkdir(parents=True, exist_ok=True)
    for name in IDX_FILES:
        (folder / f"{name}.gz").write_bytes(b"")
    return folder


def test_the_benchmark_looks_for_fashion_mnist_where_fedhmc_run_does(tmp_path, monkeypatch):
    from benchmarks.common import fmnist_dir, fmnist_places

    monkeypatch.setenv("FEDHMC_CACHE", str(tmp_path / "cache"))  # an empty cache
    data = tmp_path / "data"
    monkeypatch.setenv("FEDHMC_DATA", str(data))
    assert fmnist_places()[0] == data
    _fake_fmnist(data / "fashion-mnist")
    assert fmnist_dir() == data / "fashion-mnist"  # before the Debian folder


def test_the_benchmarks_data_dir_option(tmp_path, monkeypatch, capsys):
    from benchmarks.common import fmnist_dir
    from benchmarks.suite import cli

    monkeypatch.setenv("FEDHMC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDHMC_DATA", raising=False)
    assert cli(["--smoke", "--only", "digits", "--data-dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--data-dir" in err[0] and "no such folder" in err[0]
    mine = _fake_fmnist(tmp_path / "mine")
    assert cli(["--smoke", "--only", "digits", "--data-dir", str(mine), "--quiet"]) == 0
    assert fmnist_dir() == mine  # --data-dir is where the suite and its children look first
