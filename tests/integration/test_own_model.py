"""A user's own module and data through the Flower apps (in-process and in Flower's
simulation engine): the same chain as the engine."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

pytest.importorskip("flwr")  # (a machine with torch alone skips this module)

import torch
from _data import write_image_clients
from _grids import InProcessGrid
from fedhmc_clients.app import make_client_app
from fedhmc_clients.compute import COLOCATED_KEY
from fedhmc_server.loop import serve

from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run

pytestmark = pytest.mark.slow  # Flower

MODULE = """
import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, channels=3, classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        self.head = nn.Linear(channels * 4 * 4, classes)

    def forward(self, x):
        x = torch.max_pool2d(torch.tanh(self.conv(x)), 2)
        return self.head(x.flatten(1))


def make(channels=3):
    return SmallCNN(channels)
"""


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """usernets.py (a small CNN) importable from tmp_path, and data.npz with a split of
    its own over 4 clients: images (n, 1, 8, 8), 3 classes."""
    (tmp_path / "usernets.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("usernets", None)
    write_image_clients(tmp_path / "data.npz", 4)
    return tmp_path


def _cfg(root, name, **kw):
    return RunConfig(
        dataset=str(root / "data.npz"),
        model="usernets:make",
        model_arg="channels=2",
        rounds=3,
        local_steps=2,
        leapfrog_steps=3,
        chains=2,
        batch_size=8,
        burn_in=1,
        step_size=0.01,
        out=str(root / name),
        **kw,
    )


@pytest.mark.parametrize("colocated", [False, True])
def test_a_user_module_on_the_flower_apps_equals_the_engine(user_files, colocated):
    engine = run(_cfg(user_files, "e"), progress=False)
    cfg = engine.config.replace(out=str(user_files / "f"), resume=False)
    app = make_client_app({COLOCATED_KEY: True} if colocated else None)
    flower = serve(InProcessGrid(app, cfg.num_clients, cfg.to_run_config()), cfg)
    assert engine.config.num_clients == 4 and engine.config.partition == "given"
    if colocated:  # one batch, as on the engine: the same numbers
        assert torch.equal(flower.theta_bar, engine.theta_bar)
    else:  # client by client, then averaged by the server: the same up to float rounding
        torch.testing.assert_close(flower.theta_bar, engine.theta_bar, rtol=1e-5, atol=1e-6)
    saved = json.loads((user_files / "f" / "config.json").read_text())
    assert saved["model"] == "usernets:make" and saved["data_sha256"]


def test_a_user_module_in_the_simulation_engine_equals_the_engine(user_files):
    from fedhmc_server.simulation import run_flower

    engine = run(_cfg(user_files, "e"), progress=False)
    flower = run_flower(_cfg(user_files, "sim"), progress=False)
    assert flower.summary["backend"] == "flower"
    assert torch.equal(flower.theta_bar, engine.theta_bar)


def test_a_client_with_other_data_than_the_server_refuses_the_round(user_files):
    from fedhmc.errors import FedHMCError

    other = np.load(user_files / "data.npz")
    arrays = {k: other[k] for k in other.files}
    arrays["y_train"] = (arrays["y_train"] + 1) % 3
    np.savez(user_files / "other.npz", **arrays)
    cfg = _cfg(user_files, "f", max_failed_rounds=1).resolve()
    rc = {**cfg.to_run_config(), "dataset": str(user_files / "other.npz"), "data-sha256": ""}
    grid = InProcessGrid(make_client_app(), cfg.num_clients, rc)
    with pytest.raises(FedHMCError, match="differs from the server's") as e:
        serve(grid, cfg)
    assert "\n" not in str(e.value)
