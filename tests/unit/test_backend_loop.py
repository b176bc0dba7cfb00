"""The round loop drives a Backend (fedhmc.runtime.loop.Backend), which alone holds θ̄:
checkpoints save θ̄ once, in the backend's state, and a checkpoint of another format is
refused in one line naming the fedhmc that wrote it."""

from __future__ import annotations

import ast
import csv
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from fedhmc.errors import ConfigError, RunInterrupted
from fedhmc.runtime import checkpoint
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import EngineBackend, run
from fedhmc.runtime.loop import RoundStats, run_loop
from fedhmc.runtime.problem import build_problem

ROOT = Path(__file__).resolve().parents[2]
KW = dict(num_clients=2, chains=2, rounds=6, burn_in=1, save_samples=True)


def _stop_at(round_: int):
    def on_round(row):
        if row["round"] == round_:
            os.kill(os.getpid(), signal.SIGINT)

    return on_round


def _rows(out: Path) -> list[dict]:
    with open(out / "metrics.csv") as f:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(f)]


def test_a_checkpoint_holds_theta_bar_once_in_the_backends_state(tmp_path):
    result = run(RunConfig(**KW, out=str(tmp_path / "r")), progress=False)
    state, _ = checkpoint.load(tmp_path / "r")
    assert state["_header"]["format"] == checkpoint.FORMAT == 4
    assert "theta_bar" not in state
    assert torch.equal(state["backend"]["fields"]["position"], result.theta_bar.cpu())


@pytest.mark.parametrize("fmt", [3, 5])
def test_a_checkpoint_of_another_format_is_refused_naming_its_version(
    tmp_path, monkeypatch, cli, fmt
):
    """A run folder whose checkpoint another fedhmc wrote (an older format, or a newer
    one) is refused in one line by a resume and by ``fedhmc diagnose`` of its checkpoint's
    draws, naming the version that wrote it and what to do, with the run's files untouched.
    (``fedhmc export`` and ``plot`` read samples.npy, config.json and the CSV files, never
    the checkpoint.)"""
    cut = tmp_path / "cut"
    with pytest.raises(RunInterrupted):
        run(RunConfig(**KW, out=str(cut)), progress=False, on_round=_stop_at(4))
    state, _ = checkpoint.load(cut)
    state = {k: v for k, v in state.items() if not k.startswith("_")}
    monkeypatch.setattr(checkpoint, "FORMAT", fmt)
    monkeypatch.setattr(checkpoint, "__version__", "0.0.1")
    checkpoint.save(cut, state)  # as another fedhmc wrote it
    checkpoint.save(cut, state)
    monkeypatch.undo()
    before = {p.name: p.read_bytes() for p in cut.iterdir() if p.is_file()}
    said = f"written by fedhmc 0.0.1 (checkpoint format {fmt})"
    resume = RunConfig(**KW, out=str(cut), resume=True)
    for refused in (
        lambda: checkpoint.load(cut),
        lambda: checkpoint.peek(cut),
        lambda: run(resume, progress=False),
    ):
        with pytest.raises(ConfigError, match=r"written by fedhmc 0\.0\.1") as e:
            refused()
        assert said in str(e.value) and "use fedhmc 0.0.1" in str(e.value)
        assert "\n" not in str(e.value)
    (cut / "samples.npy").unlink()  # diagnose reads the checkpoint's draws
    for argv in (("run", "--resume", cut), ("diagnose", cut)):
        code, _, err = cli(*argv)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    after = {p.name: p.read_bytes() for p in cut.iterdir() if p.is_file()}
    assert after == {k: v for k, v in before.items() if k != "samples.npy"}


class Drift:
    """A backend of its own: θ̄ moves by 0.1 a round; no state a checkpoint keeps."""

    name = "flower"

    def __init__(self, shape):
        self.position = torch.zeros(shape, dtype=torch.float64)
        self.rounds = []

    def round(self, r: int) -> RoundStats:
        self.rounds.append(r)
        self.position = self.position + 0.1
        return RoundStats(grad_evals=4, finite=True, clients=2, bytes_down=8, bytes_up=16)

    def state_dict(self):
        return None

    def load_state_dict(self, saved: dict) -> None:
        raise AssertionError("never resumed")

    def summary(self) -> dict:
        return {"drift": len(self.rounds)}


def test_run_loop_drives_a_backend_and_reads_its_position(tmp_path):
    cfg = RunConfig(**{**KW, "rounds": 3}, out=str(tmp_path / "d")).resolve()
    problem = build_problem(cfg)
    backend = Drift((cfg.chains, problem.dim))
    seen = []
    result = run_loop(
        cfg,
        problem.evaluator,
        backend,
        dim=problem.dim,
        num_clients=2,
        description="drift",
        progress=False,
        on_round=seen.append,
    )
    assert backend.rounds == [1, 2, 3] and [row["round"] for row in seen] == [1, 2, 3]
    assert torch.equal(result.theta_bar, backend.position)
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["backend"] == "flower" and summary["drift"] == 3
    assert summary["grad_evals"] == 12 and summary["bytes_total"] == 72
    assert list(summary)[-1] == "drift"  # the backend's items come last
    state, _ = checkpoint.load(tmp_path / "d")
    assert state["backend"] is None and "theta_bar" not in state
    with pytest.raises(ConfigError, match="cannot be resumed"):
        run_loop(
            cfg.replace(resume=True),
            problem.evaluator,
            Drift((cfg.chains, problem.dim)),
            dim=problem.dim,
            num_clients=2,
            description="drift",
        )


def test_the_engine_backend_is_a_backend(tmp_path):
    cfg = RunConfig(**KW, out=str(tmp_path / "e")).resolve()
    problem = build_problem(cfg)
    backend = EngineBackend(cfg, problem, torch.device("cpu"))
    theta0 = backend.position.clone()
    saved = backend.state_dict()
    stats = backend.round(1)
    assert isinstance(stats, RoundStats) and stats.clients == 2 and stats.finite
    assert isinstance(stats.energy_error, float)
    assert not torch.equal(backend.position, theta0)
    backend.load_state_dict(saved)
    assert torch.equal(backend.position, theta0) and backend.summary() == {}


def test_the_engine_runs_the_engine_only(tmp_path):
    with pytest.raises(ConfigError, match="config with fedhmc.run$"):
        run(RunConfig(backend="flower", out=str(tmp_path / "f")), progress=False)
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize(
    "path",
    [
        "fedhmc/runtime/loop.py",
        "fedhmc/runtime/engine.py",
        "fedhmc/runtime/backends.py",
        "fedhmc/runner.py",
        "server/async_loop.py",
    ],
)
def test_the_loops_functions_are_short(path):
    """No function longer than 60 lines, none with more than 6 positional parameters,
    and no ``nonlocal``."""
    tree = ast.parse((ROOT / path).read_text())
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Nonlocal), f"{path}:{node.lineno}: nonlocal"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            positional = len(node.args.posonlyargs) + len(node.args.args)
            assert lines <= 60, f"{path}:{node.lineno}: {node.name} has {lines} lines"
            assert positional <= 6, f"{path}:{node.lineno}: {node.name}"
