"""No silent no-ops: an option that would do nothing is refused, a setting that played no
part in a run is recorded as ``null``, and an export that a resumed run outdates says so."""

import json

import numpy as np
import pytest

from fedhmc.errors import ConfigError
from fedhmc.runtime.config import RunConfig, recorded_settings, unused_settings

# --------------------------------------------------------------- --participation alone


def test_participation_without_clients_per_round_is_refused_in_one_line(cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("run", "--participation", "uniform", "--rounds", "2", "--out", out)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "--participation uniform has no effect without --clients-per-round" in lines[0]
    assert "add --clients-per-round" in lines[0] and "drop --participation" in lines[0]
    assert not out.exists()


def test_participation_alone_is_refused_from_python_and_flower_run_configs():
    with pytest.raises(ConfigError, match="no effect without --clients-per-round"):
        RunConfig(participation="weighted").resolve()
    # Flower's run config writes an unset option as "": the same refusal
    flower = RunConfig.from_mapping({"participation": "normalized", "clients-per-round": ""})
    with pytest.raises(ConfigError, match="no effect without --clients-per-round"):
        flower.resolve()
    ok = RunConfig(participation="weighted", clients_per_round=3).resolve()  # with S: fine
    assert ok.participation == "weighted"


@pytest.mark.parametrize("algorithm", ["sgld", "sghmc"])
def test_participation_refusal_of_the_stale_samplers_gives_their_reason(algorithm):
    with pytest.raises(ConfigError) as e:
        RunConfig(algorithm=algorithm, clients_per_round=2).resolve()
    assert f"is not an option of --algorithm {algorithm}" in str(e.value)
    assert "pooled data" in str(e.value)
    assert "debiased" not in str(e.value)


# -------------------------------------------------------- config.json: null where unused


def _tiny_npz(path, test_labels=None):
    """A tiny image data set with its own split over 4 clients."""
    rng = np.random.default_rng(0)
    y_test = np.arange(12) % 3 if test_labels is None else np.asarray(test_labels)
    np.savez(
        path,
        x_train=rng.normal(size=(40, 1, 12, 12)).astype("float32"),
        y_train=np.arange(40) % 3,
        x_test=rng.normal(size=(len(y_test), 1, 12, 12)).astype("float32"),
        y_test=y_test,
        client_train=np.arange(40) % 4,
    )
    return path


CNN = ["--model", "cnn", "--local-steps", "2", "--leapfrog-steps", "2", "--batch-size", "5",
       "--chains", "2", "--quiet"]  # fmt: skip


def test_a_cnn_on_a_given_split_records_what_played_no_part_as_null(cli, tmp_path):
    data = _tiny_npz(tmp_path / "d.npz")
    out = tmp_path / "run"
    code, _, err = cli("run", "--dataset", data, *CNN, "--rounds", "2", "--out", out)
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())
    for key in ("hidden", "dirichlet_alpha", "min_client_size", "classes_per_client",
                "quantity_sigma", "round_timeout", "straggler_factor", "on_failure",
                "participation"):  # fmt: skip
        assert config[key] is None, key
    for key in ("anchor_batch_size", "staleness", "staleness_dist", "max_staleness"):
        assert key not in config, key  # other samplers' options: not this run's
    assert config["model"] == "cnn" and config["partition"] == "given"
    assert config["model_batching"] == "auto" and config["rho"] == 1.0
    assert config["local_steps"] == 2 and config["num_clients"] == 4


def test_settings_that_take_part_are_recorded():
    mlp = RunConfig(model="mlp", hidden="16", dirichlet_alpha=0.3).resolve().recorded()
    assert mlp["hidden"] == "16" and mlp["dirichlet_alpha"] == 0.3
    assert mlp["model_batching"] is None  # the MLP is not a module
    shards = RunConfig(partition="shards", classes_per_client=3).resolve().recorded()
    assert shards["classes_per_client"] == 3 and shards["dirichlet_alpha"] is None
    sgld = RunConfig(algorithm="sgld", staleness=2).resolve().recorded()
    assert sgld["staleness"] == 2 and "rho" not in sgld  # (FA-HMC's option)
    flower = RunConfig(backend="flower", round_timeout=30.0).resolve().recorded()
    assert flower["round_timeout"] == 30.0
    gauss = RunConfig(dataset="gaussian-hetero").resolve().recorded()
    assert gauss["model"] is None and gauss["partition"] is None and gauss["hidden"] is None


def test_recording_is_idempotent_and_reads_back_as_the_same_run():
    cfg = RunConfig(model="cnn", hidden="7", dirichlet_alpha=0.2, partition="iid").resolve()
    rec = cfg.recorded()
    assert recorded_settings(rec) == rec
    assert {"hidden", "dirichlet_alpha"} <= set(unused_settings(rec))
    back = RunConfig.from_mapping(rec)  # None: the field's default, not an error
    assert back.hidden == RunConfig().hidden and back.model == "cnn"
    assert back.resolve().recorded() == rec


def test_a_resumed_cnn_run_equals_an_uninterrupted_one(cli, tmp_path):
    data = _tiny_npz(tmp_path / "d.npz")
    a, b = tmp_path / "a", tmp_path / "b"
    code, _, err = cli("run", "--dataset", data, *CNN, "--rounds", "2", "--burn-in", "0",
                       "--out", a)  # fmt: skip
    assert code == 0, err
    code, _, err = cli("run", "--resume", a, "--rounds", "4", "--quiet")  # reads the nulls back
    assert code == 0, err
    code, _, err = cli("run", "--dataset", data, *CNN, "--rounds", "4", "--burn-in", "0",
                       "--out", b)  # fmt: skip
    assert code == 0, err

    def rows(run):
        lines = (run / "metrics.csv").read_text().splitlines()
        head = lines[0].split(",")
        keep = [i for i, k in enumerate(head) if k != "wall_s"]
        return [[line.split(",")[i] for i in keep] for line in lines]

    assert rows(a) == rows(b)
    assert json.loads((a / "config.json").read_text())["hidden"] is None


def test_a_resume_from_python_compares_what_played_a_part(tmp_path):
    from fedhmc.runtime.engine import run

    data = _tiny_npz(tmp_path / "d.npz")
    kw = dict(dataset=str(data), model="cnn", local_steps=2, leapfrog_steps=2, batch_size=5,
              burn_in=0, out=str(tmp_path / "r"))  # fmt: skip
    run(RunConfig(**kw, rounds=2), progress=False)
    res = run(RunConfig(**kw, rounds=3, resume=True), progress=False)
    assert res.summary["status"] == "completed" and res.summary["resumed_from_round"] == 2
    with pytest.raises(ConfigError, match="--local-steps"):  # a setting that counts still does
        run(RunConfig(**{**kw, "local_steps": 3}, rounds=4, resume=True), progress=False)


# ------------------------------------------------------------ an export a resume outdates


def test_resume_renames_an_earlier_export_and_says_so(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("run", "--rounds", "2", "--burn-in", "0", "--quiet", "--out", out)[0] == 0
    (out / "posterior.nc").write_bytes(b"draws of rounds 1-2")
    code, _, err = cli("run", "--resume", out, "--rounds", "3", "--quiet")
    assert code == 0, err
    assert not (out / "posterior.nc").exists()
    assert (out / "posterior.outdated.nc").read_bytes() == b"draws of rounds 1-2"
    line = [x for x in err.splitlines() if "posterior.outdated.nc" in x]
    assert len(line) == 1 and "export again" in line[0]


def test_a_refused_resume_leaves_the_export_alone(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("run", "--rounds", "2", "--burn-in", "0", "--quiet", "--out", out)[0] == 0
    (out / "posterior.nc").write_bytes(b"x")
    code, _, _ = cli("run", "--resume", out, "--rounds", "3", "--local-steps", "3")
    assert code == 2
    assert (out / "posterior.nc").exists() and not (out / "posterior.outdated.nc").exists()


def test_overwrite_removes_the_replaced_runs_export(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("run", "--rounds", "2", "--quiet", "--out", out)[0] == 0
    (out / "posterior.nc").write_bytes(b"x")
    (out / "posterior.outdated.nc").write_bytes(b"y")
    assert cli("run", "--rounds", "2", "--quiet", "--overwrite", "--out", out)[0] == 0
    assert not (out / "posterior.nc").exists() and not (out / "posterior.outdated.nc").exists()


# ------------------------------------------- a resume, and a label no training row has


def test_a_value_given_to_a_setting_that_played_no_part_does_not_block_a_resume(cli, tmp_path):
    """(The command line refuses such a value; Python takes it, and records it as null.)"""
    from fedhmc.runtime.engine import run

    data = _tiny_npz(tmp_path / "d.npz")
    out = tmp_path / "r"
    code, _, err = cli("run", "--dataset", data, *CNN, "--rounds", "1", "--hidden", "7",
                       "--out", out)  # fmt: skip
    assert code == 2 and "--hidden 7 applies to --model mlp" in err and not out.exists()
    cfg = RunConfig(
        dataset=str(data),
        model="cnn",
        local_steps=2,
        leapfrog_steps=2,
        batch_size=5,
        chains=2,
        rounds=2,
        hidden="7",
        round_timeout=30,
        out=str(out),
    )  # fmt: skip (the CNN options above, from Python)
    run(cfg, progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["hidden"] is None and config["round_timeout"] is None
    code, _, err = cli("run", "--resume", out, "--rounds", "3", "--quiet")
    assert code == 0, err


def test_a_test_label_that_no_training_example_has_is_a_one_line_warning(tmp_path, capsys):
    from fedhmc_datasets.user import load_npz

    data = _tiny_npz(tmp_path / "d.npz", test_labels=[0, 1, 2, 99])
    split = load_npz(data)
    assert split.num_classes == 100
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning" in err[0] and "99" in err[0] and "y_test" in err[0]
    load_npz(_tiny_npz(tmp_path / "ok.npz"))  # every test label seen in training: quiet
    assert capsys.readouterr().err == ""


# ------------------------------------------------ a sweep does not run a finished cell again


def test_a_finished_cnn_cell_is_not_run_again(tmp_path):
    from fedhmc.sweep.cells import cell_done, run_cell

    data = _tiny_npz(tmp_path / "d.npz")
    settings = {"dataset": str(data), "model": "cnn", "local-steps": 2, "leapfrog-steps": 2,
                "batch-size": 5, "rounds": 2}  # fmt: skip
    cell = tmp_path / "cells" / "c"
    assert run_cell(settings, str(cell))["status"] == "completed"
    assert json.loads((cell / "config.json").read_text())["hidden"] is None
    assert cell_done(cell, settings)
    assert not cell_done(cell, {**settings, "local-steps": 3})
