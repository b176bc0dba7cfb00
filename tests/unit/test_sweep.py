"""``fedhmc sweep``: grid parsing, parallel = serial, resuming, summaries and selection."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedhmc.cli.main import main
from fedhmc.sweep.grid import cell_id, expand_grid, load_sweep_file, parse_grid
from fedhmc.sweep.table import (
    format_mean_std,
    format_summary,
    mean_std,
    read_table,
    select_best,
    summarize,
)

TINY = ["--rounds", "3", "--local-steps", "2", "--leapfrog-steps", "2"]
GRID = "step-size=0.005,0.01 seed=0,1"


def _strip(rows: list[dict]) -> list[dict]:
    """The table without what may differ between two runs of the same cells."""
    return [{k: v for k, v in r.items() if k not in ("wall_s", "out")} for r in rows]


def _sweep(out: Path, *extra: str) -> int:
    return main(["sweep", "--grid", GRID, *TINY, "--quiet", "--out", str(out), *extra])


def test_grid_parsing_and_cell_ids(tmp_path):
    grid = parse_grid("leapfrog-steps=1,10 step_size=1e-3,3e-3 seed=0")
    assert grid == {"leapfrog-steps": ["1", "10"], "step-size": ["1e-3", "3e-3"], "seed": ["0"]}
    cells = expand_grid(grid)
    assert len(cells) == 4 and cells[1] == {
        "leapfrog-steps": "1",
        "step-size": "3e-3",
        "seed": "0",
    }
    # the id is stable, readable, and depends on the parsed values, not their spelling
    a = cell_id({"step-size": "1e-2", "seed": "0"}, {"step-size": "1e-2"})
    b = cell_id({"step-size": 0.01, "seed": 0}, {"step-size": 0.01})
    assert a == b and a.startswith("eta0.01-")
    assert a != cell_id({"step-size": 0.01, "seed": 1}, {"step-size": 0.01})
    toml = tmp_path / "sweep.toml"
    toml.write_text("[grid]\nstep-size = [0.005, 0.01]\nseed = 0\n[base]\nrounds = 3\n")
    grid, base = load_sweep_file(toml)
    assert grid == {"step-size": [0.005, 0.01], "seed": [0]} and base == {"rounds": 3}


@pytest.mark.slow  # multiprocessing
def test_two_workers_give_the_same_table_and_resume_skips_done_cells(tmp_path, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    assert _sweep(two, "--workers", "2") == 0
    assert _sweep(one) == 0
    rows1, rows2 = read_table(one / "results.csv"), read_table(two / "results.csv")
    assert len(rows1) == 4 * 3  # 4 cells × 3 rounds
    assert {r["status"] for r in rows1} == {"completed"}
    assert _strip(rows1) == _strip(rows2)
    record = json.loads((one / "sweep.json").read_text())
    assert record["grid"] == parse_grid(GRID) and len(record["cells"]) == 4
    for col in ("cell", "leapfrog-steps", "step-size", "seed", "nll_mean", "bytes_up"):
        assert col in rows1[0]

    # lose one cell, leave another half done: only those two run again
    cells = sorted((one / "cells").iterdir())
    mtimes = {c.name: (c / "summary.json").stat().st_mtime_ns for c in cells}
    import shutil

    shutil.rmtree(cells[0])
    summary = json.loads((cells[1] / "summary.json").read_text())
    (cells[1] / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    capsys.readouterr()
    assert main(["sweep", "--grid", GRID, *TINY, "--out", str(one)]) == 0
    out = capsys.readouterr().out
    assert "skipped 2 completed cells" in out and "running 2" in out
    for c in cells[2:]:
        assert (c / "summary.json").stat().st_mtime_ns == mtimes[c.name]
    assert _strip(read_table(one / "results.csv")) == _strip(rows1)


@pytest.mark.slow  # multiprocessing
def test_killed_sweep_resumes_with_the_missing_cells_only(tmp_path, capsys):
    out = tmp_path / "killed"
    args = ["sweep", "--grid", GRID, "--rounds", "8", "--local-steps", "2"]
    args += ["--leapfrog-steps", "2", "--quiet", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedhmc", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )

    def completed() -> list[Path]:
        done = []
        for s in out.glob("cells/*/summary.json"):
            try:
                if json.loads(s.read_text())["status"] == "completed":
                    done.append(s)
            except (OSError, ValueError, KeyError):
                pass
        return done

    deadline = time.monotonic() + 120
    while not completed() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.terminate()
    proc.wait(timeout=30)
    done = completed()
    assert 1 <= len(done) < 4  # killed mid-way
    mtimes = {s: s.stat().st_mtime_ns for s in done}
    capsys.readouterr()
    assert main(args[:-3] + ["--out", str(out)]) == 0
    log = capsys.readouterr().out
    assert f"skipped {len(done)} completed cells" in log
    assert f"running {4 - len(done)} " in log
    assert all(s.stat().st_mtime_ns == m for s, m in mtimes.items())
    rows = read_table(out)
    assert len(rows) == 4 * 8 and {r["status"] for r in rows} == {"completed"}


def test_failed_cell_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    out = tmp_path / "div"
    code = main(["sweep", "--grid", "step-size=0.01,1000", *TINY, "--out", str(out)])
    assert code == 0
    rows = read_table(out / "results.csv")
    status = {r["step-size"]: r["status"] for r in rows}
    assert status == {0.01: "completed", 1000.0: "diverged"}
    record = json.loads((out / "sweep.json").read_text())
    assert {c["status"] for c in record["cells"]} == {"completed", "diverged"}
    assert "diverged" in capsys.readouterr().out


def _row(cell, k, eta, seed, rnd, nll, acc=0.5, status="completed"):
    return {
        "cell": cell,
        "status": status,
        "leapfrog-steps": k,
        "step-size": eta,
        "seed": seed,
        "out": f"cells/{cell}",
        "round": rnd,
        "nll_mean": nll,
        "accuracy": acc,
    }


def _known_table() -> list[dict]:
    """K = 1: η = 0.003 wins on the mean although seed 0 favours 0.001; K = 10: η = 0.001.

    Round 1 holds misleading values (only the final round counts), and a failed cell
    with a tiny nll must be ignored.
    """
    final = {  # (K, η): nll per seed
        (1, 0.001): (0.90, 1.50),
        (1, 0.003): (1.00, 1.02),
        (10, 0.001): (0.40, 0.42),
        (10, 0.003): (0.60, 0.70),
    }
    rows = []
    for (k, eta), nlls in final.items():
        for seed, nll in enumerate(nlls):
            cell = f"K{k}-eta{eta}-s{seed}"
            rows.append(_row(cell, k, eta, seed, 1, 0.01, acc=0.99))
            rows.append(_row(cell, k, eta, seed, 2, nll, acc=1 - nll / 2))
    rows.append(_row("bad", 1, 0.01, 0, 1, 0.001, acc=1.0, status="diverged"))
    return rows


def test_select_picks_the_known_step_size(tmp_path):
    sel = select_best(_known_table(), "nll_mean")
    assert sel["keys"] == ["leapfrog-steps"]
    picked = {r["leapfrog-steps"]: r["step-size"] for r in sel["selected"]}
    assert picked == {1: 0.003, 10: 0.001}
    assert sel["selected"][0]["nll_mean_mean"] == pytest.approx(1.01)
    assert "lower is better" in sel["rule"] and "over 2 seed(s)" in sel["rule"]
    acc = select_best(_known_table(), "accuracy")  # higher is better: the same answer
    assert {r["leapfrog-steps"]: r["step-size"] for r in acc["selected"]} == picked
    assert "higher is better" in acc["rule"]


def test_select_on_a_real_sweep_writes_selected_csv(tmp_path, capsys):
    out = tmp_path / "sel"
    assert main(["sweep", "--grid", "step-size=0.002,0.01", *TINY, "--out", str(out),
                 "--select", "best-by=nll_mean"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "best step-size overall by mean final nll_mean over 1 seed(s)" in text
    lines = (out / "selected.csv").read_text().splitlines()
    assert lines[0].startswith("step-size,seeds,nll_mean_mean") and len(lines) == 2


def test_summary_mean_and_std_over_seeds():
    s = summarize(_known_table(), metrics=["nll_mean", "accuracy"])
    assert s["keys"] == ["step-size", "leapfrog-steps"]
    groups = {(g["settings"]["leapfrog-steps"], g["settings"]["step-size"]): g for g in s["groups"]}
    assert len(groups) == 4 and all(g["n"] == 2 for g in groups.values())
    mean, std = groups[(1, 0.001)]["stats"]["nll_mean"]
    assert mean == pytest.approx(1.2)
    assert std == pytest.approx(math.sqrt(((0.9 - 1.2) ** 2 + (1.5 - 1.2) ** 2) / 1))
    mean, std = groups[(10, 0.003)]["stats"]["accuracy"]
    assert mean == pytest.approx(1 - 0.65 / 2) and std == pytest.approx(0.05 / math.sqrt(2))
    best = s["groups"][s["best"]["nll_mean"]]["settings"]
    assert best == {"step-size": 0.001, "leapfrog-steps": 10}
    assert s["groups"][s["best"]["accuracy"]]["settings"] == best
    text = format_summary(s)
    assert "1.2 ± 0.42" in text and "best nll_mean (lowest): step-size=0.001" in text


def test_the_sd_of_one_value_is_undefined_not_zero():
    mean, sd = mean_std([0.25])
    assert mean == 0.25 and math.isnan(sd)
    assert all(math.isnan(x) for x in mean_std([None, float("nan")]))  # no value at all
    assert format_mean_std(mean, sd) == "0.25 ± —"
    assert format_mean_std(0.8123, 0.0, ".4f", ".4f") == "0.8123 ± 0.0000"  # a real 0
    assert format_mean_std(math.nan, math.nan) == "—"
    # The summary of a one-seed table says so, with the same "—".
    one = [r for r in _known_table() if r["seed"] == 0]
    text = format_summary(summarize(one, metrics=["nll_mean"]))
    assert "± —" in text and "± 0" not in text and "nan" not in text


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--grid", "foo=1,2"], "unknown key 'foo'; valid: dataset"),
        (["--grid", "step-size"], "malformed --grid item"),
        (["--grid", "seed=0,,1"], "malformed --grid item"),
        (["--grid", "step-size=abc"], "--step-size must be a number"),
        (["--grid", "seed=0 seed=1"], "twice"),
        (["--grid", "seed=0", "--seed", "1"], "both in the grid"),
        (["--grid", "seed=0", "--select", "nll_mean"], "best-by="),
        ([], "give --grid"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, needle):
    assert main(["sweep", *argv, "--quiet", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedhmc sweep: error:") and needle in err


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


@pytest.mark.slow  # multiprocessing
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and prctl")
def test_workers_die_with_a_killed_sweep_and_the_folder_is_locked(tmp_path, capsys):
    out = tmp_path / "locked"
    args = ["sweep", "--grid", GRID, "--rounds", "400", "--local-steps", "2"]
    args += ["--leapfrog-steps", "2", "--quiet", "--workers", "2", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedhmc", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while time.monotonic() < deadline:
            workers = [
                p
                for p in _children(proc.pid)
                if "spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
            ]
            if len(workers) == 2 and list(out.glob("cells/*/metrics.csv")):
                break
            time.sleep(0.1)
        assert len(workers) == 2
        # A second sweep into the same folder is refused while the first runs.
        capsys.readouterr()
        assert main(args) == 2
        assert "in use" in capsys.readouterr().err
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers)


def test_a_worker_whose_sweep_is_gone_starts_no_cell(tmp_path, monkeypatch):
    import os

    from fedhmc.sweep import cells

    monkeypatch.setattr(cells, "_PARENT", os.getppid() + 1)  # not this process's parent
    res = cells.run_cell({"rounds": 2}, str(tmp_path / "cell"))
    assert res["status"] == "interrupted"
    assert not (tmp_path / "cell").exists()


@pytest.fixture
def signalled_cells(monkeypatch):
    """Every cell run in this process reports "interrupted" (stopped by a signal); returns
    the list of cells that started."""
    import fedhmc.sweep.cells as cells

    started = []

    def fake_run_cell(settings, cell_dir, threads=None):
        started.append(cell_dir)
        return {"status": "interrupted", "error": "stopped by SIGTERM"}

    monkeypatch.setattr(cells, "run_cell", fake_run_cell)
    return started


def test_a_signal_stops_a_paper_experiment_not_just_its_cell(
    tmp_path, monkeypatch, signalled_cells
):
    # One process, cells in turn: the first cell is stopped by a signal (run_cell reports
    # "interrupted"); the experiment must stop there instead of starting the next cell.
    import fedhmc.sweep.cells as cells
    from fedhmc.errors import FedHMCError
    from fedhmc.experiments import paper_fmnist

    monkeypatch.setattr(cells, "cell_done", lambda cell_dir, settings: False)
    todo = [(f"c{i}", {"dataset": "digits", "rounds": 2, "seed": i}) for i in range(3)]
    with pytest.raises(FedHMCError, match="stopped in cell c0"):
        paper_fmnist._run_missing(tmp_path, todo, 1, "cells")
    assert len(signalled_cells) == 1


def test_a_signal_stops_a_one_worker_sweep_not_just_its_cell(tmp_path, signalled_cells):
    # The same for `fedhmc sweep --workers 1`: the stopped cell is recorded as interrupted,
    # the others stay pending, and none of them starts.
    import fedhmc.sweep.cells as cells
    from fedhmc.errors import FedHMCError

    grid = {"seed": [0, 1, 2]}
    with pytest.raises(FedHMCError, match="stopped in cell"):
        cells.run_sweep(
            tmp_path, grid, {"dataset": "digits", "rounds": 2}, progress=False, log=lambda *_: None
        )
    assert len(signalled_cells) == 1
    status = [c["status"] for c in json.loads((tmp_path / "sweep.json").read_text())["cells"]]
    assert sorted(status) == ["interrupted", "pending", "pending"]
