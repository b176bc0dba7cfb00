"""`fedhmc run`: files, reproducibility, and one-line errors."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedhmc.cli.main import main

QUICK = ["--rounds", "4", "--local-steps", "2", "--leapfrog-steps", "3", "--quiet"]


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_run_writes_valid_files(tmp_path):
    out = tmp_path / "run"
    assert (
        main(
            ["run", *QUICK, "--burn-in", "1", "--chains", "2", "--save-samples", "--out", str(out)]
        )
        == 0
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dataset"] == "digits" and cfg["step_size"] > 0 and cfg["leapfrog_steps"] == 3
    rows = read_csv(out / "metrics.csv")
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4]
    for col in ("accuracy", "brier", "ece", "nll_mean", "nll_sum", "wall_s", "grad_evals"):
        assert all(np.isfinite(float(r[col])) for r in rows), col
    assert 0.0 <= float(rows[-1]["accuracy"]) <= 1.0
    # 10 clients · 2 chains · T·(K+1) = 8 evaluations per round.
    assert int(rows[-1]["grad_evals"]) == 4 * 10 * 2 * 8
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["grad_evals"] == 640
    d = summary["dim"]
    assert summary["bytes_total"] == 4 * 2 * 10 * 2 * d * 4  # rounds·(up+down)·N·S·D·4 bytes
    samples = np.load(out / "samples.npy")
    assert samples.shape == (3, 2, d) and samples.dtype == np.float32


def test_gaussian_target_columns(tmp_path):
    out = tmp_path / "g"
    assert (
        main(
            [
                "run",
                "--dataset",
                "gaussian-hetero",
                "--dim",
                "3",
                "--chains",
                "20",
                *QUICK,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = read_csv(out / "metrics.csv")
    assert {"w2", "mean_error"} <= set(rows[0]) and "accuracy" not in rows[0]
    assert float(rows[-1]["w2"]) > 0


def test_same_seed_gives_identical_files(tmp_path):
    for name in ("a", "b", "c"):
        seed = "1" if name != "c" else "2"
        main(
            [
                "run",
                *QUICK,
                "--seed",
                seed,
                "--rho",
                "0.5",
                "--save-samples",
                "--burn-in",
                "0",
                "--out",
                str(tmp_path / name),
            ]
        )

    def content(name):
        rows = read_csv(tmp_path / name / "metrics.csv")
        for r in rows:
            r.pop("wall_s")
        return rows, (tmp_path / name / "samples.npy").read_bytes()

    assert content("a") == content("b")
    assert content("a")[1] != content("c")[1]


def test_fald_is_k_equal_one(tmp_path):
    assert (
        main(
            ["run", "--algorithm", "fald", "--rounds", "2", "--quiet", "--out", str(tmp_path / "f")]
        )
        == 0
    )
    assert json.loads((tmp_path / "f" / "config.json").read_text())["leapfrog_steps"] == 1


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--dataset", "nope"], "unknown dataset"),
        (["--rho", "1.5"], "--rho"),
        (["--leapfrog-steps", "0"], "--leapfrog-steps"),
        (["--step-size", "0"], "--step-size"),
        (["--step-size", "-1e-3"], "--step-size"),
        (["--num-clients", "100000"], "--num-clients"),
        (["--algorithm", "fald", "--leapfrog-steps", "5"], "fald"),
        (["--rounds", "abc"], "rounds"),
        (["--out", "/proc/forbidden/x"], "--out"),
    ],
)
def test_bad_input_exits_with_one_line(tmp_path, args, needle):
    cmd = [
        sys.executable,
        "-m",
        "fedhmc",
        "run",
        "--rounds",
        "1",
        "--out",
        str(tmp_path / "x"),
        *args,
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0] and "Traceback" not in proc.stderr


def test_divergence_stops_with_one_line_and_valid_files(tmp_path, capsys):
    out = tmp_path / "div"
    code = main(["run", "--step-size", "50", "--rounds", "5", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "round 1" in err[0] and "--step-size" in err[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["rounds_completed"] == 0
    assert read_csv(out / "metrics.csv") == []


def test_data_command_prints_table_and_saves_heatmap(tmp_path, capsys):
    plot = tmp_path / "labels.png"
    args = ["data", "--partition", "dirichlet", "--dirichlet-alpha", "0.1", "--plot", str(plot)]
    assert main([*args, "--num-clients", "5"]) == 0
    out = capsys.readouterr().out
    assert "digits:" in out and "partition dirichlet over 5 clients, α = 0.1" in out
    # One row per client, each with its size; the sizes add up to the training set.
    rows = [ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3, 4]
    total = next(ln.split() for ln in out.splitlines() if ln.split()[:1] == ["all"])
    assert sum(int(r[1]) for r in rows) == int(total[1]) == 1437
    assert "mean label entropy per client" in out
    assert plot.exists() and plot.stat().st_size > 1000
    assert main(["data", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "fashion-mnist" in listing and "shards" in listing


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--partition", "nope"], "nope"),
        (["--dirichlet-alpha", "0"], "--dirichlet-alpha"),
        (["--partition", "shards", "--classes-per-client", "11"], "classes"),
        (["--num-clients", "100000"], "clients"),
        (["--dataset", "gaussian-hetero"], "synthetic target"),
    ],
)
def test_data_command_bad_input_is_one_line(args, needle, capsys):
    assert main(["data", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_scaling_default_depends_on_dataset():
    from fedhmc.runtime.config import RunConfig

    assert RunConfig().resolve().scaling == "standardize"
    assert RunConfig(dataset="blr-synthetic", dim=5).resolve().scaling == "none"
    # "none" is a real choice, not "unset".
    assert RunConfig.from_mapping({"scaling": "none"}).resolve().scaling == "none"
    assert RunConfig.from_mapping({"scaling": ""}).resolve().scaling == "standardize"


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedhmc {version('fedhmc')}"


def test_version_falls_back_to_the_package_version(monkeypatch):
    import importlib
    import importlib.metadata

    import fedhmc

    cli_main = importlib.import_module("fedhmc.cli.main")  # the module, not its main()

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setattr(fedhmc, "__version__", "9.8.7")
    assert cli_main.version() == "9.8.7"


# A --model factory of the tests: fail=yes makes it raise, so that one cell of a sweep fails
# while its other cells run.
FLAKY_FACTORY = """
import torch


def net(fail="no"):
    if fail == "yes":
        raise RuntimeError("boom: this factory fails on purpose")
    return torch.nn.Linear(64, 10)
"""

SWEEP = ["sweep", "--rounds", "2", "--local-steps", "2", "--leapfrog-steps", "2"]


@pytest.fixture
def flaky_model(tmp_path, monkeypatch):
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "flaky_factory_cli.py").write_text(FLAKY_FACTORY)
    monkeypatch.syspath_prepend(str(folder))
    return "flaky_factory_cli:net"


def test_a_sweep_whose_cells_all_failed_exits_1_with_one_line_even_quiet(
    tmp_path, capsys, flaky_model
):
    out = tmp_path / "sweep"
    grid = ["--grid", "seed=0,1", "--model", flaky_model, "--model-arg", "fail=yes"]
    code = main([*SWEEP, *grid, "--quiet", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "2 of 2 cells failed" in lines[0]
    assert str(out / "sweep.json") in lines[0] and "boom" in lines[0]
    record = json.loads((out / "sweep.json").read_text())
    assert [c["status"] for c in record["cells"]] == ["failed", "failed"]
    assert all("boom" in c["error"] for c in record["cells"])


def test_a_sweep_with_one_failed_cell_exits_1_and_names_it(tmp_path, capsys, flaky_model):
    out = tmp_path / "sweep"
    grid = ["--grid", "model-arg=fail=no,fail=yes", "--model", flaky_model]
    code = main([*SWEEP, *grid, "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1
    record = json.loads((out / "sweep.json").read_text())
    status = {c["settings"]["model-arg"]: c["status"] for c in record["cells"]}
    assert status == {"fail=no": "completed", "fail=yes": "failed"}
    failed = next(c["id"] for c in record["cells"] if c["status"] == "failed")
    summary = [ln for ln in captured.err.splitlines() if "cells failed" in ln]
    assert len(summary) == 1 and "1 of 2 cells failed" in summary[0] and failed in summary[0]
    assert "table in" in captured.out  # the completed cell's table is still written
    assert (out / "results.csv").exists()


def test_a_sweep_whose_cells_completed_or_diverged_exits_0(tmp_path, capsys):
    out = tmp_path / "sweep"
    code = main([*SWEEP, "--grid", "step-size=0.01,1000", "--quiet", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0  # a diverged cell is a result (a step size too large), not a failure
    assert "failed" not in captured.err
    record = json.loads((out / "sweep.json").read_text())
    assert sorted(c["status"] for c in record["cells"]) == ["completed", "diverged"]
