"""fedhmc never overwrites what it did not write (issue 47, items 2 and 5).

An output folder is fedhmc's only when it is new, empty, or holds fedhmc's marker: a folder
of the user's own files, the root folder and the home folder are refused, with or without
``--overwrite``, and ``--overwrite`` removes only fedhmc's files. A resume refuses a
``metrics.csv`` that differs from what its checkpoint says the run wrote. ``fedhmc
experiment`` takes the folder's lock as ``run`` and ``sweep`` do.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from fedhmc.errors import ConfigError
from fedhmc.runtime.lock import FolderLock
from fedhmc.runtime.output import MARKER

RUN = ["--dataset", "breast-cancer", "--num-clients", "3", "--local-steps", "1",
       "--leapfrog-steps", "2", "--quiet"]  # fmt: skip


def files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def one_line_refusal(cli, *argv) -> str:
    code, _, err = cli(*argv)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------- --out


@pytest.mark.parametrize("name", ["metrics.csv", "samples.npy", "summary.json", "notes.txt"])
@pytest.mark.parametrize("extra", [[], ["--overwrite"]], ids=["new", "overwrite"])
def test_a_folder_of_the_users_own_files_is_refused(tmp_path, cli, name, extra):
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text("the user's own\n")
    err = one_line_refusal(cli, "run", *RUN, "--rounds", "2", "--out", out, *extra)
    assert f"holds files fedhmc did not write ({name})" in err, err
    assert files(out) == {name: b"the user's own\n"}  # nothing written, nothing removed


def test_the_home_folder_is_refused(tmp_path, cli, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    err = one_line_refusal(cli, "run", *RUN, "--rounds", "2", "--out", home)
    assert "is your home folder" in err
    assert list(home.iterdir()) == []


def test_the_root_folder_is_refused():
    had = Path("/.lock").exists()
    lock = FolderLock("/")
    try:
        with pytest.raises(ConfigError, match="is the root folder"):
            lock.acquire()
    finally:
        lock.release()  # (should it have been taken)
    assert Path("/.lock").exists() == had


def test_overwrite_removes_only_fedhmcs_own_files(tmp_path, cli):
    out = tmp_path / "r"
    assert (
        cli("run", *RUN, "--rounds", "2", "--save-samples", "--chains", "2", "--out", out)[0] == 0
    )
    assert (out / MARKER).is_file() and (out / "samples.npy").exists()
    (out / "notes.txt").write_text("mine\n")
    (out / "workers.csv").write_text("worker\n0\n")  # as an asynchronous run leaves it
    code, _, err = cli("run", *RUN, "--rounds", "3", "--out", out, "--overwrite")
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "mine\n"
    assert not (out / "samples.npy").exists()  # the earlier run's files went
    assert not (out / "workers.csv").exists()
    assert sorted(files(out)) == sorted(
        ["notes.txt", MARKER, "config.json", "metrics.csv", "summary.json", "checkpoint.pt"]
    )


# ---------------------------------------------------------------- metrics.csv on resume


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(f)]


@pytest.fixture
def finished(tmp_path, cli) -> Path:
    out = tmp_path / "r"
    code, _, err = cli("run", *RUN, "--rounds", "3", "--burn-in", "0", "--out", out)
    assert code == 0, err
    return out


def _rename_column(path: Path) -> None:
    head, _, rest = path.read_text().partition("\n")
    path.write_text(head.replace("accuracy", "acc") + "\n" + rest)


def _change_a_row(path: Path) -> None:
    lines = path.read_text().splitlines(keepends=True)
    first = lines[1].split(",")
    first[1] = "0.123456789"
    lines[1] = ",".join(first)
    path.write_text("".join(lines))


@pytest.mark.parametrize(
    "edit, why",
    [
        (_rename_column, "has the columns"),
        (_change_a_row, "differs from the 3 rows the run wrote"),
        (lambda p: p.write_text(""), "is empty"),
        (lambda p: p.unlink(), "is missing"),
    ],
    ids=["column-renamed", "row-changed", "emptied", "deleted"],
)
def test_a_resume_refuses_a_metrics_file_the_run_did_not_write(finished, cli, edit, why):
    edit(finished / "metrics.csv")
    before = files(finished)
    err = one_line_refusal(cli, "run", "--resume", finished, "--rounds", "5", "--quiet")
    assert "metrics.csv" in err and why in err and "up to round 3" in err, err
    assert files(finished) == before


def test_rows_written_after_the_checkpoint_are_dropped_and_the_run_goes_on(finished, cli, tmp_path):
    """A run stopped between two checkpoints wrote rows its checkpoint does not cover: the
    resume drops them, and the file equals an uninterrupted run's."""
    with open(finished / "metrics.csv", "a", newline="") as f:
        f.write("4,stale,row\r\n")
    code, _, err = cli("run", "--resume", finished, "--rounds", "5", "--quiet")
    assert code == 0, err
    whole = tmp_path / "whole"
    assert cli("run", *RUN, "--rounds", "5", "--burn-in", "0", "--out", whole)[0] == 0
    assert _rows(finished / "metrics.csv") == _rows(whole / "metrics.csv")
    # and it resumes again: the checkpoint records the file as the resume wrote it
    assert cli("run", "--resume", finished, "--rounds", "6", "--quiet")[0] == 0


# ---------------------------------------------------------------- experiment and sweep


def test_an_experiment_is_refused_by_a_folder_a_run_holds(tmp_path, cli):
    out = tmp_path / "held"
    with FolderLock(out, "a run"):
        err = one_line_refusal(cli, "experiment", "stale-gaussian", "--quick", "--out", out)
        assert f"in use by process {os.getpid()} (a run still going)" in err, err
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written


def test_an_experiment_holds_its_folder_while_it_runs(tmp_path, cli, monkeypatch):
    """While an experiment runs, its folder is locked (as "an experiment"): a run or a
    second experiment there is refused."""
    from fedhmc import experiments

    out = tmp_path / "exp"
    seen = {}

    def fake(out_dir, quick=False, seed=0):
        with pytest.raises(ConfigError, match=r"\(an experiment still going\)"):
            FolderLock(out_dir, "a run").acquire()
        seen["marked"] = (Path(out_dir) / MARKER).is_file()
        return {"rows": []}

    monkeypatch.setitem(experiments.EXPERIMENTS, "stale-gaussian", (fake, "a stand-in"))
    code, _, err = cli("experiment", "stale-gaussian", "--quick", "--out", out, "--quiet")
    assert code == 0, err
    assert seen == {"marked": True}
    assert not (out / ".lock").exists()  # released at the end


@pytest.mark.parametrize("command", ["experiment", "sweep"])
def test_an_experiment_or_sweep_refuses_a_folder_of_the_users_own_files(tmp_path, cli, command):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "results.csv").write_text("the user's own\n")
    argv = (
        ["experiment", "stale-gaussian", "--quick"]
        if command == "experiment"
        else ["sweep", *RUN, "--rounds", "2", "--grid", "seed=0,1"]
    )
    err = one_line_refusal(cli, *argv, "--out", out)
    assert "holds files fedhmc did not write (results.csv)" in err, err
    assert files(out) == {"results.csv": b"the user's own\n"}


@pytest.mark.parametrize("bad", [{"bytes": "many"}, {"bytes": 10**15}, {"columns": None}])
def test_an_edited_record_in_the_checkpoints_header_is_one_line(finished, cli, bad):
    """The header's record of metrics.csv (read before the run starts) is outside the
    checkpoint's checksum: whatever it holds, a resume ends in one line, not a traceback."""
    path = finished / "checkpoint.pt"
    head, _, payload = path.read_bytes().partition(b"\n")
    header = json.loads(head)
    header["metrics"].update(bad)
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)
    err = one_line_refusal(cli, "run", "--resume", finished, "--rounds", "5", "--quiet")
    assert "metrics.csv" in err, err
