"""Checkpoints and resume: a stopped run continues to the same numbers as one never stopped.

A stop is a real SIGINT or SIGTERM sent to this process (or a ``kill -9`` of a child
process) after a chosen round; the resumed run's metrics.csv (timing columns aside),
samples.npy and summary.json metric values must equal the uninterrupted run's exactly.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhmc.cli.main import main
from fedhmc.errors import ConfigError, RunInterrupted
from fedhmc.runtime import checkpoint
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run

TIMING = {"wall_s"}


def rows(path: Path) -> list[dict]:
    with open(path / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(f)]


def assert_same(a: Path, b: Path) -> None:
    assert rows(a) == rows(b)
    sa, sb = (json.loads((p / "summary.json").read_text()) for p in (a, b))
    assert sa["status"] == sb["status"] == "completed"
    assert sa["final"] == sb["final"]
    assert sa["grad_evals"] == sb["grad_evals"]
    assert sa["diagnostics"] == sb["diagnostics"]
    if (b / "samples.npy").exists():
        assert np.array_equal(np.load(a / "samples.npy"), np.load(b / "samples.npy"))


def stop_at(round_: int, signum=signal.SIGINT):
    def on_round(row):
        if row["round"] == round_:
            os.kill(os.getpid(), signum)

    return on_round


CASES = {
    "fahmc": dict(chains=3, save_samples=True, rounds=7),
    "authors-mid-trajectory": dict(
        protocol="authors",
        local_steps=3,
        leapfrog_steps=4,
        step_size=1e-4,
        chains=2,
        rounds=8,
        save_samples=True,
    ),
    "debiased": dict(algorithm="fahmc-debiased", chains=2, rounds=6, anchor_batch_size=16),
    "sgld-stale": dict(algorithm="sgld", leapfrog_steps=None, staleness=2, chains=2, rounds=6),
    "gaussian": dict(dataset="gaussian-hetero", chains=20, rounds=6, grad_noise=1.0),
}


@pytest.mark.parametrize(
    "case,signum",
    [(c, signal.SIGINT) for c in CASES] + [("authors-mid-trajectory", signal.SIGTERM)],
)
def test_interrupt_then_resume_equals_an_uninterrupted_run(tmp_path, case, signum):
    kw = {"num_clients": 3, "local_steps": 2, "leapfrog_steps": 3, "seed": 5, **CASES[case]}
    full = run(RunConfig(**kw, out=str(tmp_path / "full")), progress=False)
    with pytest.raises(RunInterrupted) as e:
        run(RunConfig(**kw, out=str(tmp_path / "cut")), progress=False, on_round=stop_at(3, signum))
    assert e.value.exit_code == 128 + signum and e.value.round == 3
    s = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["rounds_completed"] == 3
    assert "--resume" in s["resume"]
    assert len(rows(tmp_path / "cut")) == 3
    # The handlers are restored after the run.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    resumed = run(RunConfig(**kw, out=str(tmp_path / "cut"), resume=True), progress=False)
    assert resumed.summary["resumed_from_round"] == 3
    assert torch.equal(resumed.theta_bar, full.theta_bar)
    assert_same(tmp_path / "cut", tmp_path / "full")


def test_a_finished_run_extends_with_a_larger_rounds(tmp_path):
    kw = dict(num_clients=3, local_steps=2, chains=2, seed=1)
    run(RunConfig(**kw, rounds=9, out=str(tmp_path / "long")), progress=False)
    run(RunConfig(**kw, rounds=5, out=str(tmp_path / "ext")), progress=False)
    assert main(["run", "--resume", str(tmp_path / "ext"), "--rounds", "9", "--quiet"]) == 0
    assert_same(tmp_path / "ext", tmp_path / "long")


def test_resume_refuses_another_configuration_and_reuse_of_out_is_refused(tmp_path, capsys):
    out = tmp_path / "r"
    run(RunConfig(num_clients=3, rounds=3, out=str(out)), progress=False)
    code = main(["run", "--resume", str(out), "--step-size", "0.5", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "--step-size" in err and len(err.strip().splitlines()) == 1
    # The refused call changed nothing.
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    before = (out / "metrics.csv").read_text()
    code = main(["run", "--num-clients", "3", "--rounds", "2", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "--resume" in err and "--overwrite" in err
    assert (out / "metrics.csv").read_text() == before
    assert (
        main(
            [
                "run",
                "--num-clients",
                "3",
                "--rounds",
                "2",
                "--out",
                str(out),
                "--overwrite",
                "--quiet",
            ]
        )
        == 0
    )
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 2


def test_a_corrupted_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    kw = dict(num_clients=3, rounds=8, chains=2, seed=2, checkpoint_every=2)
    run(RunConfig(**kw, out=str(tmp_path / "full")), progress=False)
    with pytest.raises(RunInterrupted):
        run(RunConfig(**kw, out=str(tmp_path / "cut")), progress=False, on_round=stop_at(5))
    cut = tmp_path / "cut"
    assert checkpoint.load(cut)[0]["round"] == 5
    # Flip a byte of the newest checkpoint: the checksum catches it, round 4's is used.
    data = bytearray((cut / "checkpoint.pt").read_bytes())
    data[-10] ^= 0xFF
    (cut / "checkpoint.pt").write_bytes(bytes(data))
    state, problems = checkpoint.load(cut)
    assert state["round"] == 4 and "checksum" in problems[0]
    run(RunConfig(**kw, out=str(cut), resume=True), progress=False)
    assert "checkpoint.pt is unusable" in capsys.readouterr().err
    assert_same(cut, tmp_path / "full")
    # A truncated file is detected too; with neither file usable, one clear line.
    (cut / "checkpoint.pt").write_bytes((cut / "checkpoint.pt").read_bytes()[:100])
    (cut / "checkpoint.prev.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="cannot resume"):
        checkpoint.load(cut)


@pytest.mark.slow
def test_kill_9_leaves_a_resumable_directory(tmp_path):
    args = [
        "--num-clients",
        "4",
        "--rounds",
        "40",
        "--local-steps",
        "20",
        "--chains",
        "2",
        "--checkpoint-every",
        "1",
        "--quiet",
    ]
    full = tmp_path / "full"
    assert main(["run", *args, "--out", str(full)]) == 0
    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedhmc", "run", *args, "--out", str(cut)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if len((cut / "metrics.csv").read_text().splitlines()) > 4:
                break
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert json.loads((cut / "summary.json").read_text())["status"] == "running"
    assert main(["run", "--resume", str(cut), "--quiet"]) == 0
    assert_same(cut, full)


def test_an_algorithm_without_a_checkpointed_server_is_refused(tmp_path):
    from fedhmc.runtime.loop import run_loop
    from fedhmc.runtime.problem import build_problem

    class Unsaved:  # a backend whose state no checkpoint keeps
        name, position = "flower", torch.zeros(1, 3)

        def state_dict(self):
            return None

    cfg = RunConfig(num_clients=2, rounds=2, out=str(tmp_path / "a"), resume=True).resolve()
    problem = build_problem(cfg)
    with pytest.raises(ConfigError, match="cannot be resumed"):
        run_loop(cfg, problem.evaluator, Unsaved(), dim=1, num_clients=2, description="")
