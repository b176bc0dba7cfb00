"""Every impossible value a user can type gets one line naming the option, exit code 2, no
traceback, and nothing written or overwritten."""

from __future__ import annotations

import gzip
import os

import pytest

from fedhmc.cli.main import main as _main


def main(argv):
    """The command line's exit status (argparse's own errors exit through SystemExit)."""
    try:
        return _main(argv)
    except SystemExit as e:
        return e.code


BAD_RUN_OPTIONS = [
    (["--num-clients", "0"], "--num-clients"),
    (["--num-clients", "-3"], "--num-clients"),
    (["--num-clients", "100000"], "--num-clients"),
    (["--rounds", "0"], "--rounds"),
    (["--local-steps", "0"], "--local-steps"),
    (["--leapfrog-steps", "0"], "--leapfrog-steps"),
    (["--chains", "0"], "--chains"),
    (["--batch-size", "-1"], "--batch-size"),
    (["--thin", "0"], "--thin"),
    (["--rho", "1.5"], "--rho"),
    (["--rho", "-0.1"], "--rho"),
    (["--rho", "nan"], "--rho"),
    (["--step-size", "0"], "--step-size"),
    (["--step-size", "-0.1"], "--step-size"),
    (["--step-size", "nan"], "--step-size"),
    (["--step-size", "abc"], "step-size"),
    (["--temperature", "0"], "--temperature"),
    (["--grad-noise", "-1"], "--grad-noise"),
    (["--prior-std", "0"], "--prior-std"),
    (["--dataset", "no-such-data"], "dataset"),
    (["--model", "resnet"], "--model"),
    (["--partition", "weird"], "partition"),
    (["--dirichlet-alpha", "0"], "--dirichlet-alpha"),
    (["--device", "cuda"], "--device"),
    (["--device", "tpu"], "--device"),
    (["--burn-in", "10", "--rounds", "10"], "--burn-in"),
    (["--burn-in", "-1"], "--burn-in"),
    (["--ece-bins", "0"], "--ece-bins"),
    (["--checkpoint-every", "-1"], "--checkpoint-every"),
    (["--sync-unit", "epoch"], "--sync-unit"),
    (["--protocol", "mine"], "--protocol"),
    (["--minibatch", "sorted"], "--minibatch"),
    (["--init", "random"], "--init"),
    (["--scaling", "log"], "--scaling"),
    (["--hidden", "a,b", "--model", "mlp"], "--hidden"),
    (["--restart-trajectories"], "--restart-trajectories"),
    (["--algorithm", "sgld", "--sync-unit", "leapfrog"], "--sync-unit"),
    (["--resume", "/nonexistent/run"], "--resume"),
]


@pytest.mark.parametrize(
    "args,names", BAD_RUN_OPTIONS, ids=lambda x: " ".join(x) if isinstance(x, list) else None
)
def test_bad_run_option_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, args, names):
    out = tmp_path / "out"
    code = main(
        ["run", "--quiet", "--out", str(out), *args]
        if "--resume" not in args
        else ["run", "--quiet", *args]
    )
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, (args, err)
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert names.lstrip("-") in err, err
    assert not out.exists() or not any(out.iterdir())


def test_unwritable_out_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["run", "--quiet", "--rounds", "1", "--out", str(blocker / "sub")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--out" in err


def test_existing_run_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--quiet", "--rounds", "1", "--num-clients", "2", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code = main(["run", "--quiet", "--rounds", "1", "--num-clients", "2", "--out", str(out)])
    assert code == 2 and "--overwrite" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_truncated_dataset_file_is_one_line(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        with gzip.open(data / f"{name}.gz", "wb") as f:
            f.write(b"\x00\x00\x08\x03\x00\x00\x00\x10")  # a header, then nothing
    out = tmp_path / "out"
    code = main(
        [
            "run",
            "--quiet",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            str(data),
            "--rounds",
            "1",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists() or not any(out.iterdir())


def test_malformed_sweep_file_and_run_config_are_one_line(tmp_path, capsys):
    bad = tmp_path / "s.toml"
    bad.write_text("[grid\nstep-size = [")
    code = main(["sweep", "--file", str(bad), "--out", str(tmp_path / "sw")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    from fedhmc.errors import ConfigError
    from fedhmc.runtime.config import RunConfig

    with pytest.raises(ConfigError, match="rounds"):
        RunConfig.from_mapping({"rounds": "many"})
    with pytest.raises(ConfigError, match="unknown setting"):
        RunConfig.from_mapping({"roundz": 3})


def test_a_finite_but_exploded_chain_ends_as_diverged(tmp_path, capsys):
    out = tmp_path / "x"
    code = main(["run", "--quiet", "--step-size", "1", "--rounds", "3", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "uniform guess" in err and "--step-size" in err
    import json

    assert json.loads((out / "summary.json").read_text())["status"] == "diverged"
    assert os.path.exists(out / "metrics.csv")
