"""The round loop drives a Backend (fedhmc.runtime.engine.Backend), which alone holds θ̄:
checkpoints save θ̄ once, in the backend's state, and a checkpoint of the earlier format
(θ̄ also saved beside it, as ``theta_bar``) resumes to the same numbers."""

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
from fedhmc.runtime.engine import EngineBackend, RoundStats, run, run_loop
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


@pytest.mark.parametrize("fmt", [2, 3])
def test_a_checkpoint_of_an_earlier_format_is_read_but_not_resumed(tmp_path, monkeypatch, fmt):
    """Formats 2 and 3 did not record what metrics.csv held: such a checkpoint still reads
    (for ``fedhmc diagnose``), but a resume of it is refused in one line saying why, with
    the run's files untouched."""
    cut = tmp_path / "cut"
    with pytest.raises(RunInterrupted):
        run(RunConfig(**KW, out=str(cut)), progress=False, on_round=_stop_at(3))
    state, _ = checkpoint.load(cut)
    state = {k: v for k, v in state.items() if not k.startswith("_") and k != "metrics"}
    monkeypatch.setattr(checkpoint, "FORMAT", fmt)
    checkpoint.save(cut, state)  # as fedhmc wrote it before format 4
    (cut / checkpoint.PREVIOUS).unlink(missing_ok=True)
    monkeypatch.undo()
    assert checkpoint.load(cut)[0]["_header"]["format"] == fmt
    before = {p.name: p.read_bytes() for p in cut.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match="does not record what metrics.csv held") as e:
        run(RunConfig(**KW, out=str(cut), resume=True), progress=False)
    assert "\n" not in str(e.value)
    assert {p.name: p.read_bytes() for p in cut.iterdir() if p.is_file()} == before


def test_a_checkpoint_of_an_unknown_format_is_refused(tmp_path, monkeypatch):
    run(RunConfig(**{**KW, "rounds": 2}, out=str(tmp_path / "r")), progress=False)
    state, _ = checkpoint.load(tmp_path / "r")
    monkeypatch.setattr(checkpoint, "FORMAT", 5)
    checkpoint.save(tmp_path / "r", {k: v for k, v in state.items() if not k.startswith("_")})
    monkeypatch.undo()
    (tmp_path / "r" / checkpoint.PREVIOUS).unlink(missing_ok=True)
    with pytest.raises(ConfigError, match="format 5, written by another fedhmc"):
        checkpoint.load(tmp_path / "r")


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
    with pytest.raises(ConfigError, match="fedhmc.runtime.backends.run_config"):
        run(RunConfig(backend="flower", out=str(tmp_path / "f")), progress=False)
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize(
    "path", ["fedhmc/runtime/engine.py", "fedhmc/runtime/backends.py", "server/async_loop.py"]
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
