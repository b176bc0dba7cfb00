"""A new federated sampler is one module and one registry entry, and nothing else.

The test writes a toy sampler (federated-averaging Langevin dynamics, one Euler step per
round on every client) as a module of its own and declares its registry entry the way
another package would (an entry point in the ``fedhmc.algorithms`` group), with no file of
fedhmc touched. It then runs it on the engine, on the Flower simulation, and through a
checkpoint and ``--resume``. On the engine and on Flower it must give the same chain, and a
resumed run the numbers of an uninterrupted one.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TOY = '''
"""A toy federated sampler: every client takes one Langevin step from θ̄ with noise of
variance 2h / w_c, and the server averages with the weights w_c (FA-LD without leapfrog)."""

import dataclasses
import sys
from dataclasses import dataclass

import torch

from fedhmc.algorithms import api, federated
from fedhmc.algorithms.fahmc import (
    Broadcast, ClientUpdate, Info, combination, round_info, round_keys, skip,
    average,
)
from fedhmc.algorithms.registry import Entry
from fedhmc.core import rng
from fedhmc.core.momentum import draw_momentum
from fedhmc.core.streams import STREAM_MINIBATCH, STREAM_MOMENTUM
from fedhmc.errors import ConfigError


@dataclass(frozen=True)
class Settings(api.Settings):
    LANGEVIN_STEP = True  # (unset: η²/2 of the dataset's η, FA-LD's learning rate)
    step_size: float | None = api.option(None, "h, the toy's Langevin step", low=0, low_open=True)


@dataclass(frozen=True)
class State:
    position: torch.Tensor
    round: int = 0


def init(position, settings):
    return State(position, 0)


def broadcast(seed, state, settings, weights=None):
    r = state.round + 1
    return Broadcast(round=r, round_seed=federated.round_seed(seed, r), position=state.position)


MESSAGE = {"theta": "position"}  # the message's arrays by wire name
REPLY = {"theta": "position"}  # the reply's


def layout(settings, round_):
    return federated.Layout(("position",), ("position",))


def client_update(message, target, settings, seeds):
    theta = message.position
    S, D = theta.shape
    M = int(seeds.shape[0])
    chains = torch.arange(S, device=theta.device)
    shared, private = round_keys(message.round_seed, seeds.to(theta.device), message.round, chains)
    x = theta.unsqueeze(1).expand(S, M, D).clone()
    g, energy = target.grad(x, rng.derive(private, STREAM_MINIBATCH), 0, True)
    xi = draw_momentum(shared, rng.derive(private, STREAM_MOMENTUM), target.weights,
                       0.0, 0, D, theta.dtype)
    h = settings.step_size
    return ClientUpdate(position=x - h * g + (2 * h) ** 0.5 * xi, energy=energy,
                        grad_evals=S * M)


def server_update(state, update, how, settings):
    return State(average(update.position, how), state.round + 1), round_info(update)


def step(seed, state, target, settings):
    return federated.step(sys.modules[__name__], seed, state, target, settings)


ENTRY = Entry("toy-ld", module_path="toy_sampler")
'''


def _plugin(folder: Path) -> None:
    """The toy module and its entry point, as an installed package would declare it."""
    (folder / "toy_sampler.py").write_text(textwrap.dedent(TOY))
    info = folder / "toy_sampler-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-sampler\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedhmc.algorithms]\ntoy-ld = toy_sampler:ENTRY\n")


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path])}
    return subprocess.run(
        [sys.executable, "-m", "fedhmc", "run", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _metrics(out: Path) -> list[dict]:
    with open(out / "metrics.csv", newline="") as f:
        return [
            # (Flower counts whole messages' bytes; the engine its arrays')
            {k: v for k, v in row.items() if k not in ("wall_s", "bytes_down", "bytes_up")}
            for row in csv.DictReader(f)
        ]


COMMON = ("--algorithm", "toy-ld", "--dataset", "gaussian-hetero", "--num-clients", "3",
          "--dim", "2", "--chains", "2", "--step-size", "0.05", "--burn-in", "2",
          "--dtype", "float64", "--threads", "1", "--quiet")  # fmt: skip


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugin")
    _plugin(folder)
    return folder


def test_the_toy_sampler_runs_on_the_engine_and_resumes(plugin):
    whole = _run(plugin, *COMMON, "--rounds", "8", "--out", "whole")
    assert whole.returncode == 0, whole.stderr
    first = _run(plugin, *COMMON, "--rounds", "4", "--out", "parts")
    assert first.returncode == 0, first.stderr
    rest = _run(plugin, *COMMON, "--rounds", "8", "--resume", "parts")
    assert rest.returncode == 0, rest.stderr
    a, b = _metrics(plugin / "whole"), _metrics(plugin / "parts")
    assert len(a) == 8 and a == b
    assert all(float(r["grad_evals"]) > 0 for r in a)


def test_the_toy_sampler_runs_on_flower_as_on_the_engine(plugin):
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    engine = _run(plugin, *COMMON, "--rounds", "4", "--out", "engine")
    assert engine.returncode == 0, engine.stderr
    flower = _run(plugin, *COMMON, "--rounds", "4", "--out", "flower", "--backend", "flower")
    assert flower.returncode == 0, flower.stderr
    a, b = _metrics(plugin / "engine"), _metrics(plugin / "flower")
    assert len(a) == len(b) == 4
    for x, y in zip(a, b, strict=True):
        for k in x:
            if k in ("round", "clients", "failed", "grad_evals"):
                assert x[k] == y[k], (k, x[k], y[k])
            elif x[k] not in ("", None):
                assert float(x[k]) == pytest.approx(float(y[k]), rel=1e-9, abs=1e-12), k
