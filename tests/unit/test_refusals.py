"""Combinations that do nothing are refused in one line, leaving nothing behind; readers of
a run's tables drop a half-written last row with a warning."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "--on-failure", "stop"], "--on-failure stop applies to --backend flower"),
        (["run", "--data-dir", "/no/such/folder"], "--data-dir /no/such/folder: no such folder"),
        (["run", "--leapfrog-step", "5"], "unrecognized arguments: --leapfrog-step 5"),
        (["run", "--nosuch"], "(see fedhmc run --help)"),
        (["sweep", "--grid", "seed=0,1", "--nosuch"], "(see fedhmc sweep --help)"),
        (["experiment", "blr-eta", "--quick", "--full"], "--quick and --full"),
        (["experiment", "fmnist-K", "--workers", "0"], "runs in one process"),
    ],
)
def test_refused_in_one_line_and_nothing_written(tmp_path, cli, argv, words):
    out = tmp_path / "out"
    code, _, err = cli(*argv, "--out", out)
    assert code == 2
    assert words in err and err.count("\n") == 1, err
    assert not out.exists()


def test_resume_with_overwrite_is_refused(tmp_path, cli):
    out = tmp_path / "r"
    assert cli("run", "--rounds", "1", "--local-steps", "1", "--quiet", "--out", out)[0] == 0
    code, _, err = cli("run", "--resume", out, "--overwrite")
    assert code == 2 and "pick one" in err


def test_experiment_without_a_name_lists_them_on_stderr(cli):
    code, out, err = cli("experiment")
    assert code == 2 and out == ""
    assert err.startswith("usage: fedhmc experiment NAME") and "fmnist-cnn" in err


def test_plot_drops_a_half_written_last_row_and_refuses_unknown_metrics(tmp_path, cli):
    out = tmp_path / "r"
    assert cli("run", "--rounds", "3", "--local-steps", "1", "--quiet", "--out", out)[0] == 0
    text = (out / "metrics.csv").read_text()
    (out / "metrics.csv").write_text(text + "4,4,0.5,0.3")  # killed mid-row
    code, stdout, err = cli("plot", out)
    assert code == 0, err
    assert "dropped the last row" in err and err.count("\n") == 1
    code, _, err = cli("plot", out, "--kind", "rounds", "--metric", "nosuch")
    assert code == 2 and "no column 'nosuch' in the table" in err and "nll_mean" in err


def test_a_resume_inside_the_burn_in_names_a_fix_that_is_accepted(tmp_path, cli):
    out = tmp_path / "r"
    argv = ["run", "--rounds", "6", "--burn-in", "4", "--local-steps", "1", "--quiet"]
    assert cli(*argv, "--out", out)[0] == 0
    code, _, err = cli("run", "--resume", out, "--rounds", "3")
    assert code == 2 and "give --rounds above 4" in err and "--burn-in below" not in err
    assert cli("run", "--resume", out, "--rounds", "8", "--quiet")[0] == 0


def test_experiment_list_gives_every_preset_a_duration(cli):
    import inspect

    from fedhmc.experiments import DURATIONS, EXPERIMENTS

    assert set(DURATIONS) == set(EXPERIMENTS)
    for name, (fn, _) in EXPERIMENTS.items():
        assert (DURATIONS[name][1] is not None) == ("full" in inspect.signature(fn).parameters)
    code, out, _ = cli("experiment", "--list")
    assert code == 0 and "fmnist-cnn" in out
    assert all("[default: " in line for line in out.splitlines())


def test_an_extension_says_which_burn_in_it_keeps_and_equals_that_run(tmp_path, cli):
    import csv

    out, fresh = tmp_path / "r", tmp_path / "fresh"
    base = ["run", "--local-steps", "1", "--quiet"]
    assert cli(*base, "--rounds", "10", "--out", out)[0] == 0  # burn-in: 10 % of 10 = 1
    code, _, err = cli("run", "--resume", out, "--quiet")  # finished: nothing to extend
    assert code == 0 and "extending" not in err
    code, _, err = cli("run", "--resume", out, "--rounds", "12", "--quiet")
    assert code == 0
    note = [line for line in err.splitlines() if "extending" in line]
    assert len(note) == 1
    assert "from 10 to 12 rounds" in note[0] and "burn-in of 1 round," in note[0]
    assert "--rounds 12 --burn-in 1" in note[0]
    # The note is true: the extension equals the uninterrupted run it names.
    assert cli(*base, "--rounds", "12", "--burn-in", "1", "--out", fresh)[0] == 0

    def table(run):
        with open(run / "metrics.csv", newline="") as f:
            return [(r["round"], r["samples"], r["nll_mean"]) for r in csv.DictReader(f)]

    assert table(out) == table(fresh)
