"""A GPU draws the CPU's random numbers: whole runs on the device path, checked on a CPU.

On a CPU the counter-based generator hashes in NumPy; on any other device it hashes in
int64 tensor arithmetic. Both must give the same bits, or a GPU run would be another
chain. Here every engine algorithm, both protocols and every participation scheme run
twice on the CPU, once through each path, and must write identical metrics. (The GPU's
own floating-point rounding is what `pytest -m gpu` checks on a GPU.)
"""

from __future__ import annotations

import csv

import pytest

from fedhmc import RunConfig, run
from fedhmc.core import rng

BASE = dict(
    dataset="digits",
    num_clients=4,
    partition="iid",
    local_steps=2,
    leapfrog_steps=3,
    batch_size=16,
    chains=2,
    rounds=3,
    burn_in=1,
    dtype="float64",
)

CELLS = {
    "fahmc": {},
    "fald": {"algorithm": "fald", "leapfrog_steps": 1},
    "debiased": {"algorithm": "fahmc-debiased"},
    "sghmc": {"algorithm": "sghmc", "leapfrog_steps": None, "staleness": 1},
    "sgld": {
        "algorithm": "sgld",
        "leapfrog_steps": None,
        "staleness": 2,
        "staleness_dist": "uniform",
    },
    "authors": {"protocol": "authors", "step_size": 1e-4},
    "weighted": {"clients_per_round": 2, "participation": "weighted"},
    "uniform": {"clients_per_round": 2, "participation": "uniform"},
    "normalized": {"clients_per_round": 3, "participation": "normalized"},
    "mlp-noise": {"model": "mlp", "hidden": "8", "grad_noise": 0.1},
    "gaussian": {"dataset": "gaussian-hetero", "dim": 3, "grad_noise": 0.5},
}


def _metrics(path) -> list[dict]:
    with open(path / "metrics.csv") as f:
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in csv.DictReader(f)]


@pytest.mark.parametrize("name", list(CELLS))
def test_the_device_path_gives_the_same_run(name, tmp_path, monkeypatch):
    cfg = {**BASE, **CELLS[name]}
    run(RunConfig(**cfg, out=str(tmp_path / "host")), progress=False)
    monkeypatch.setattr(rng, "_TENSOR_PATH_ON_CPU", True)
    run(RunConfig(**cfg, out=str(tmp_path / "device")), progress=False)
    host, device = _metrics(tmp_path / "host"), _metrics(tmp_path / "device")
    assert len(host) == BASE["rounds"]
    assert host == device
