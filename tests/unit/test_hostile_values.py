"""Values a hostile user gives that once ended in a traceback or in another library's
words: each is refused in one line that names the option, with exit status 2, before
anything is written."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--step-size", "1e308"], "--step-size 1e+308 is too large (at most 1e+15"),
        (["--dataset", "gaussian-hetero", "--dim", "0"], "--dim must be ≥ 1, got 0"),
        (["--dataset", "gaussian-hetero", "--dim", "-3"], "--dim must be ≥ 1, got -3"),
        (["--seed", "4294967296"], "--seed must be an integer in [0, 4294967295]"),
        (["--seed", "-1"], "--seed must be an integer in [0, 4294967295]"),
        (["--threads", "100000"], "--threads 100000: this machine has"),
    ],
    ids=["step-size-overflow", "dim-0", "dim-negative", "seed-33-bits", "seed-negative",
         "threads"],
)  # fmt: skip
def test_a_hostile_value_is_one_line(cli, tmp_path, argv, line):
    out = tmp_path / "run"
    code, stdout, stderr = cli("run", *argv, "--rounds", "1", "--out", out)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fedhmc run: error: {line}"), stderr
    assert "Traceback" not in stderr and not out.exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from fedhmc.cli.main import main

    out = tmp_path_factory.mktemp("runs") / "r1"
    assert main(["run", "--rounds", "2", "--save-samples", "--out", str(out), "--quiet"]) == 0
    return out


def _one_line(code, stderr, start):
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(start), stderr
    return lines[0]


@pytest.mark.parametrize("command", ["export", "plot"])
def test_an_output_file_that_is_a_folder_or_has_no_folder_is_one_line(
    cli, finished_run, tmp_path, command
):
    pytest.importorskip("h5netcdf") if command == "export" else None
    (tmp_path / "exists").mkdir()
    cases = [("/", "is a folder"), (tmp_path / "exists", "is a folder")]
    if command == "export":  # (plot makes the folder of its figures)
        cases.append((tmp_path / "nothere" / "x", "no folder"))
    for out, why in cases:
        code, _, err = cli(command, finished_run, "--out", out)
        assert why in _one_line(code, err, f"fedhmc {command}: error: --out {out}")
    assert list((tmp_path / "exists").iterdir()) == []  # no .tmp left behind


def test_a_dataset_or_table_that_is_no_regular_file_is_one_line(cli, tmp_path):
    code, _, err = cli("run", "--dataset", "/dev/zero", "--rounds", "1", "--out", tmp_path / "r")
    assert "not a regular file" in _one_line(code, err, "fedhmc run: error: --dataset /dev/zero")
    code, _, err = cli("plot", "/dev/zero")  # (it read forever)
    _one_line(code, err, "fedhmc plot: error: /dev/zero is not a regular file")


def test_a_threshold_that_is_not_a_number_is_refused(cli, finished_run):
    code, _, err = cli("plot", finished_run, "--kind", "rounds-to", "--threshold", "nan")
    _one_line(code, err, "fedhmc plot: error: --threshold must be a finite number, got nan")


def test_a_tensorboard_file_is_refused_before_anything_is_written(cli, tmp_path):
    (tmp_path / "afile").write_text("mine")
    out = tmp_path / "r"
    code, _, err = cli("run", "--tensorboard", tmp_path / "afile", "--rounds", "1", "--out", out)
    _one_line(code, err, f"fedhmc run: error: --tensorboard {tmp_path / 'afile'} is a file")
    assert not out.exists()


def test_json_nested_too_deeply_is_one_line(cli, finished_run, tmp_path):
    import shutil

    run = tmp_path / "deep"
    shutil.copytree(finished_run, run)
    config = (run / "config.json").read_text()
    (run / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = cli("run", "--resume", run)
    assert "nested too deeply" in _one_line(code, err, f"fedhmc run: error: --resume {run}")
    (run / "config.json").write_text(config)
    blob = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(b"[" * 100_000 + b"]" * 100_000 + blob[blob.index(b"\n") :])
    code, _, err = cli("run", "--resume", run)
    _one_line(code, err, "fedhmc run: error: cannot resume from")


def test_a_summary_without_status_and_a_negative_byte_count_read_plainly(
    cli, finished_run, tmp_path
):
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "summary.json").write_text('{"x": 1}')
    code, _, err = cli("run", "--rounds", "1", "--out", run)
    line = _one_line(code, err, f"fedhmc run: error: --out {run} already holds a run;")
    assert "None" not in line  # it said "(None, None rounds)"
    blob = (run / "checkpoint.pt").read_bytes()
    header = json.loads(blob[: blob.index(b"\n")])
    header["bytes"] = -5
    (run / "checkpoint.pt").write_bytes(json.dumps(header).encode() + blob[blob.index(b"\n") :])
    code, _, err = cli("run", "--resume", run)
    line = _one_line(code, err, "fedhmc run: error: cannot resume from")
    assert "negative" in line and "of -5 bytes" not in line


def test_a_resume_refuses_another_algorithm_by_its_own_name(cli, finished_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    code, _, err = cli("run", "--resume", run, "--algorithm", "sgld")
    line = _one_line(code, err, "fedhmc run: error: cannot resume: --algorithm was 'fahmc'")
    assert "leapfrog" not in line  # it blamed --leapfrog-steps, never given


@pytest.mark.parametrize(
    "body, call",
    [
        ("sys.exit(0)", "sys.exit(0)"),
        ("sys.exit(3)", "sys.exit(3)"),
        ("os._exit(5)", "os._exit(5)"),
    ],
)
def test_a_model_factory_that_exits_is_one_line(cli, tmp_path, monkeypatch, body, call):
    """It exited 0 having done nothing (or with its own code and no word)."""
    name = "exiting_" + "".join(c for c in body if c.isalnum())  # one module per case
    (tmp_path / f"{name}.py").write_text(f"import os, sys\n\ndef make():\n    {body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    code, _, err = cli("run", "--model", f"{name}:make", "--rounds", "1", "--out", out)
    line = _one_line(code, err, f"fedhmc run: error: --model {name}:make: the factory")
    assert f"ended the program (it called {call})" in line


def test_a_sweep_refuses_an_unknown_selection_metric_before_running(cli, tmp_path):
    out = tmp_path / "sweep"
    code, _, err = cli("sweep", "--grid", "seed=0,1", "--rounds", "1", "--select",
                       "best-by=nonexistent", "--out", out)  # fmt: skip
    _one_line(code, err, "fedhmc sweep: error: --select best-by=nonexistent: no such metric")
    assert not out.exists()  # it was refused after every cell had run


def test_a_grid_axis_in_both_the_file_and_the_command_line_is_refused(cli, tmp_path):
    toml = tmp_path / "sweep.toml"
    toml.write_text("[grid]\nstep-size = [0.01, 0.02]\nseed = [0]\n")
    out = tmp_path / "sweep"
    code, _, err = cli("sweep", "--file", toml, "--grid", "step-size=0.05", "--rounds", "1",
                       "--out", out)  # fmt: skip
    _one_line(code, err, f"fedhmc sweep: error: --grid step-size is also a grid axis of {toml}")
    assert not out.exists()


@pytest.mark.parametrize("command", ["diagnose", "export"])
def test_samples_of_another_width_are_refused(cli, finished_run, tmp_path, command):
    """(They were exported and diagnosed as the run's.)"""
    import shutil

    import numpy as np

    pytest.importorskip("h5netcdf") if command == "export" else None
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    np.save(run / "samples.npy", np.load(run / "samples.npy")[..., :12])
    extra = ["--out", tmp_path / "x.nc"] if command == "export" else []
    code, _, err = cli(command, run, *extra)
    line = _one_line(code, err, f"fedhmc {command}: error: {run / 'samples.npy'} holds draws of 12")
    assert "the run has 650 (its summary.json)" in line


def test_infinite_initial_weights_are_named_not_blamed_on_the_step_size(cli, tmp_path, monkeypatch):
    (tmp_path / "inf_weights.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef make():\n    net = nn.Linear(64, 10)\n"
        "    with torch.no_grad():\n        net.weight.fill_(float('inf'))\n    return net\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    code, _, err = cli("run", "--model", "inf_weights:make", "--rounds", "2", "--out", out)
    line = _one_line(code, err, "fedhmc run: error: --init auto: the initial position holds")
    assert "non-finite" in line and "step" not in line and not out.exists()


def _started(out, rows: int = 2, limit_s: float = 120.0):
    """Wait (on the files, not a clock's guess) until the run in ``out`` wrote ``rows``."""
    import time

    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        m = out / "metrics.csv"
        if m.exists() and len(m.read_text().splitlines()) > rows:
            return
        time.sleep(0.05)
    raise AssertionError("the run did not start")


def test_two_sigterms_exit_143_and_summary_recommends_only_a_resume_that_works(tmp_path):
    """A second SIGTERM stops the run at once with 128 + 15 (it was 130, SIGINT's); before
    the first checkpoint, summary.json says to start again, not to --resume (refused)."""
    import json
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"

    def default_signals():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    proc = subprocess.Popen(
        [sys.executable, "-m", "fedhmc", "run", "--rounds", "100000", "--out", str(out),
         "--quiet"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        preexec_fn=default_signals,
    )  # fmt: skip
    import threading
    import time

    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        _started(out)
        proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 120  # the first is acknowledged before the second is sent
        while not any("stopping after this round" in ln for ln in lines):
            if proc.poll() is not None:  # (its round ended and it stopped: one signal)
                break
            assert time.monotonic() < end, lines
            time.sleep(0.01)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
        reader.join(timeout=60)
    finally:
        proc.kill()
    err = "".join(lines)
    assert proc.returncode == 143, err
    assert "stopping after this round" in err  # said at once, --quiet or not
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    if (out / "checkpoint.pt").exists():  # (the first signal's round ended in between)
        assert summary["resume"].startswith(f"fedhmc run --resume {out}")
    else:
        assert "resume" not in summary and "--overwrite" in summary["note"]


def test_a_resume_refuses_a_module_that_changed_size_before_touching_the_run(
    cli, tmp_path, monkeypatch
):
    """(It resumed, failed at its next round and rewrote summary.json.)"""
    module = tmp_path / "sized_net.py"
    module.write_text("from torch import nn\n\ndef make():\n    return nn.Linear(64, 10)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    spec = ["--model", "sized_net:make"]
    assert cli("run", *spec, "--rounds", "2", "--quiet", "--out", out)[0] == 0
    summary = (out / "summary.json").read_text()
    module.write_text(
        "from torch import nn\n\ndef make():\n"
        "    return nn.Sequential(nn.Linear(64, 11), nn.Linear(11, 10))\n"
    )
    import sys

    sys.modules.pop("sized_net", None)
    code, _, err = cli("run", "--resume", out, *spec, "--rounds", "4")
    line = _one_line(code, err, "fedhmc run: error: cannot resume: the model has 835 parameters")
    assert "checkpoint 650" in line and (out / "summary.json").read_text() == summary


@pytest.mark.parametrize("name", ["kmnist", "cifar2"])
def test_download_goes_into_the_data_dir_given(tmp_path, monkeypatch, name):
    """(It downloaded into the cache whatever --data-dir said.) No network here: torchvision's
    dataset class is replaced by one that records where it was asked to download."""
    import torchvision.datasets

    asked = []

    class Fake:
        def __init__(self, root, train=True, download=False):
            asked.append((root, download))
            raise RuntimeError("no network in this test")

    for cls in ("KMNIST", "CIFAR10"):
        monkeypatch.setattr(torchvision.datasets, cls, Fake)
    from fedhmc_datasets.registry import load_dataset

    from fedhmc.errors import FedHMCError

    monkeypatch.setenv("FEDHMC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDHMC_DATA", raising=False)  # (no copy elsewhere to be found)
    with pytest.raises(FedHMCError, match=f"into {tmp_path / 'mine'} failed"):
        load_dataset(name, data_dir=tmp_path / "mine", download=True)
    assert asked == [(str(tmp_path / "mine"), True)]


def _forge(run, change):
    """``run``'s checkpoint with its payload changed by ``change`` and a valid checksum."""
    import hashlib
    import io
    import json

    import torch

    blob = (run / "checkpoint.pt").read_bytes()
    header = json.loads(blob[: blob.index(b"\n")])
    state = torch.load(io.BytesIO(blob[blob.index(b"\n") + 1 :]), weights_only=True)
    buf = io.BytesIO()
    torch.save(change(state), buf)
    payload = buf.getvalue()
    header.update(bytes=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    (run / "checkpoint.pt").write_bytes(json.dumps(header).encode() + b"\n" + payload)
    (run / "checkpoint.prev.pt").unlink(missing_ok=True)


def _set(state, path, value):
    target = state
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return state


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda s: {}, "its 'round' is missing"),
        (lambda s: _set(s, ["round"], "two"), "its 'round' is a str"),
        (lambda s: _set(s, ["draws"], "zzz"), "its 'draws' is a str"),
        (lambda s: _set(s, ["totals", "clients"], "x"), "its round or totals are not"),
        (lambda s: _set(s, ["evaluator", "log_probs"], __import__("torch").zeros(360, 13)),
         "model average is (360, 13)"),
        (lambda s: _set(s, ["backend", "fields", "position"], __import__("torch").zeros(1, 653)),
         "the model has 650 parameters now and the run's checkpoint 653"),
    ],
    ids=["empty", "round-str", "draws-str", "totals", "wide-average", "wide-position"],
)  # fmt: skip
def test_a_forged_checkpoint_payload_is_one_line(cli, finished_run, tmp_path, change, words):
    """A payload with a valid checksum but fields of the wrong kind or width (KeyError,
    ValueError, AttributeError and RuntimeError tracebacks before)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    config = (run / "config.json").read_text()
    _forge(run, change)
    code, _, err = cli("run", "--resume", run, "--rounds", "9")
    assert words in _one_line(code, err, "fedhmc run: error: cannot resume")
    assert (run / "config.json").read_text() == config  # nothing rewritten


def test_a_full_disk_stops_the_run_with_its_checkpoint_and_nothing_half_written(
    cli, tmp_path, monkeypatch
):
    """The disk fills up while round 4's checkpoint is written (simulated: the fourth
    write of a checkpoint fails with ENOSPC after writing part of it). It was three chained
    OSError tracebacks, .tmp files left and summary.json stuck at "running"; now one line,
    exit status 1, the checkpoint of round 3 kept, and the resume gives the chain of a run
    never stopped."""
    import errno
    import json

    from fedhmc.runtime import checkpoint, output

    real, calls = output.open_private, {"n": 0}

    def filling(path):
        f = real(path)
        if str(path).endswith(checkpoint.NAME + ".tmp"):
            calls["n"] += 1
            if calls["n"] == 4:
                f.write(b"half a checkpoint")
                f.close()
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return f

    monkeypatch.setattr(output, "open_private", filling)
    args = ["--rounds", "6", "--chains", "2", "--checkpoint-every", "1", "--quiet"]
    out = tmp_path / "run"
    code, _, err = cli("run", *args, "--out", out)
    line = _one_line_status(code, err, 1, "fedhmc run: error: the disk is full")
    assert "the checkpoint of round 3 is kept" in line and f"--resume {out}" in line
    assert not list(out.glob("*.tmp"))
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
    monkeypatch.setattr(output, "open_private", real)  # space freed
    assert cli("run", "--resume", out, "--quiet")[0] == 0
    whole = tmp_path / "whole"
    assert cli("run", *args, "--out", whole)[0] == 0
    import csv

    def rows(path):
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(path.open())]

    assert rows(out / "metrics.csv") == rows(whole / "metrics.csv")


def _one_line_status(code, stderr, status, start):
    lines = stderr.strip().splitlines()
    assert code == status and len(lines) == 1 and lines[0].startswith(start), stderr
    return lines[0]
