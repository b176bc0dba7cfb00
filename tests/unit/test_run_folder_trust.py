"""A run folder never names code that runs (issue 47, item 1).

Tried as an attacker would: a finished run's folder is edited (its config.json, and the
checkpoint's header, which its checksum does not cover) so that the run names a module with
a side effect, or ``subprocess:getoutput`` with a shell command as its argument. A
``fedhmc run --resume`` of it must be refused in one line, exit 2, before anything is
imported, with the run's files untouched; with ``--model`` given again, equal to the
recorded spec, the user's own model resumes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from planted_module import planted_module

RUN = ["--dataset", "breast-cancer", "--num-clients", "3", "--rounds", "3", "--local-steps",
       "1", "--leapfrog-steps", "2", "--quiet"]  # fmt: skip

EVIL = """
from pathlib import Path
Path({marker!r}).write_text("imported")


def make(**kw):
    Path({marker!r}).write_text("called")
"""


@pytest.fixture
def planted(tmp_path, cli, monkeypatch):
    """A finished 3-round run, and an importable module that leaves a file when imported."""
    run = tmp_path / "run"
    code, _, err = cli("run", *RUN, "--out", run)
    assert code == 0, err
    with planted_module(tmp_path, monkeypatch, EVIL) as marker:
        yield run, marker


def tamper(run: Path, **changes) -> None:
    """Set ``changes`` in the run's config.json and in its checkpoints' headers (whose
    checksum covers the payload only), as someone who sends the folder could."""
    config = json.loads((run / "config.json").read_text())
    config.update(changes)
    (run / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        path = run / name
        if not path.exists():
            continue
        head, _, payload = path.read_bytes().partition(b"\n")
        header = json.loads(head)
        header["config"].update(changes)
        path.write_bytes(json.dumps(header).encode() + b"\n" + payload)


def files(run: Path) -> dict:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}


def refused(cli, run: Path, *extra) -> str:
    before = files(run)
    code, _, err = cli("run", "--resume", run, "--rounds", "5", "--quiet", *extra)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert files(run) == before, "a refused resume changed the run's files"
    return lines[0]


@pytest.mark.parametrize("backend", ["engine", "flower"])
def test_a_folder_naming_a_module_is_refused_before_the_module_is_imported(planted, cli, backend):
    run, marker = planted
    tamper(run, model="fedhmc_planted:make", model_arg="width=3", backend=backend)
    err = refused(cli, run)
    assert "your own model fedhmc_planted:make" in err and "--model fedhmc_planted:make" in err
    assert not marker.exists(), f"the planted module ran ({marker.read_text()})"
    assert "fedhmc_planted" not in sys.modules


def test_a_folder_naming_a_shell_command_runs_nothing(planted, cli):
    run, marker = planted
    tamper(run, model="subprocess:getoutput", model_arg=f"cmd='touch {marker}'")
    err = refused(cli, run)
    assert "subprocess:getoutput" in err
    assert not marker.exists(), "the folder's command ran"


def test_another_model_given_on_a_resume_is_refused_before_it_is_imported(planted, cli):
    run, marker = planted
    err = refused(cli, run, "--model", "fedhmc_planted:make")
    assert "is not the run's model (logistic)" in err
    assert not marker.exists() and "fedhmc_planted" not in sys.modules


def test_a_folder_naming_pickled_data_needs_its_data_dir_again(planted, cli, tmp_path):
    run, _ = planted
    tamper(run, dataset="cifar2", data_dir=str(tmp_path / "site"))
    err = refused(cli, run)
    assert "pickles" in err and f"--data-dir {tmp_path / 'site'}" in err


def test_the_users_own_model_resumes_when_named_again(tmp_path, cli):
    run = tmp_path / "run"
    model = ["--model", "torch.nn:Linear", "--model-arg", "in_features=30",
             "--model-arg", "out_features=2"]  # fmt: skip
    code, _, err = cli("run", *RUN, *model, "--out", run)
    assert code == 0, err
    err = refused(cli, run)
    assert "your own model torch.nn:Linear" in err and "--model torch.nn:Linear" in err
    code, _, err = cli("run", "--resume", run, "--rounds", "5", "--quiet", *model[:2])
    assert code == 0, err
    assert json.loads((run / "summary.json").read_text())["rounds_completed"] == 5


def test_a_sweep_cell_folder_naming_a_module_runs_the_sweeps_own_settings(planted, cli):
    """A sweep's cells take their settings from the sweep's command, never from a cell's
    folder: a cell folder edited to name a module reruns with the sweep's model, and the
    module is never imported."""
    run, marker = planted
    sweep = run.parent / "sweep"
    argv = ("sweep", *RUN, "--grid", "seed=0", "--out", sweep)
    code, _, err = cli(*argv)
    assert code == 0, err
    (cell,) = (sweep / "cells").iterdir()
    tamper(cell, model="fedhmc_planted:make", model_arg="width=3")
    code, _, err = cli(*argv)
    assert code == 0, err
    assert not marker.exists() and "fedhmc_planted" not in sys.modules
    assert json.loads((cell / "config.json").read_text())["model"] == "logistic"


def test_the_resume_hints_name_what_the_command_line_must_give_again():
    """A stopped run's hints (the signal's line, summary.json's ``resume``, a failure's) name
    the --model and --data-dir that a resume of it needs."""
    from fedhmc.errors import RunInterrupted
    from fedhmc.runtime.checkpoint import resume_flags
    from fedhmc.runtime.config import IN_MEMORY

    assert resume_flags({"model": "logistic", "dataset": "digits"}) == ""
    assert resume_flags({"model": None, "dataset": "gaussian-hetero"}) == ""
    own = {"model": "mynets:make cnn", "dataset": "digits"}
    assert resume_flags(own) == " --model 'mynets:make cnn'"
    assert resume_flags({**own, "dataset": IN_MEMORY}) == ""  # resumed from Python only
    cifar = {"model": "logistic", "dataset": "cifar2", "data_dir": "/data/cifar"}
    assert resume_flags(cifar) == " --data-dir /data/cifar"
    assert resume_flags({**cifar, "data_dir": None}) == ""
    stop = RunInterrupted(2, 4, "runs/x", resume_flags(own))
    assert str(stop).endswith("fedhmc run --resume runs/x --model 'mynets:make cnn'")
