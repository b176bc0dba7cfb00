"""``fmnist-T``: Fashion-MNIST logistic regression, T ∈ {1, 10, 20, 50, 100} at K = 10, under
Algorithm 3.
"""

from __future__ import annotations

from pathlib import Path

from fedhmc.experiments._common import PAPER_FMNIST, DataExperiment, _data_experiment
from fedhmc.experiments.fmnist import _fmnist_base


def fmnist_t(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """Fashion-MNIST logistic regression, 10 iid clients, batch 1000: T ∈ {1, 10, 20, 50, 100}
    at K = 10, 200 rounds (``--full``). The reduced default runs T ∈ {1, 10, 20, 50} for 10
    rounds (about 5 minutes on 2 cores)."""
    budget = "quick" if quick else "full" if full else "reduced"
    Ts = {"quick": [1, 2], "reduced": [1, 10, 20, 50], "full": [1, 10, 20, 50, 100]}[budget]
    base = {**_fmnist_base(budget, 1), "leapfrog-steps": 10, "seed": seed}
    base.pop("local-steps")
    return _data_experiment(
        out_dir,
        DataExperiment(
            "fmnist-T",
            base,
            "local-steps",
            Ts,
            budget,
            PAPER_FMNIST,
            f"Fashion-MNIST, 10 iid clients, K = 10, η = 1e-3 ({budget})",
            f"{budget} budget: {base['rounds']} rounds; η = 1e-3 for every T",
        ),
    )
