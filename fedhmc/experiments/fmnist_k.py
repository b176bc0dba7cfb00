"""``fmnist-K``: Fashion-MNIST logistic regression, K ∈ {1, 10, 50, 100} at T = 50, under
Algorithm 3.
"""

from __future__ import annotations

from pathlib import Path

from fedhmc.experiments._common import PAPER_FMNIST, DataExperiment, _data_experiment
from fedhmc.experiments.fmnist import _fmnist_base


def fmnist_k(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """Fashion-MNIST logistic regression, 10 iid clients, batch 1000: K ∈ {1, 10, 50, 100}
    at T = 50, 200 rounds (``--full``). The reduced default runs T = 5 and 10 rounds (about
    5 minutes on 2 cores). η = 1e-3 (the dataset default) for every K; the paper tuned η per
    setting."""
    budget = "quick" if quick else "full" if full else "reduced"
    T = {"quick": 2, "reduced": 5, "full": 50}[budget]
    Ks = [1, 10] if quick else [1, 10, 50, 100]
    base = {**_fmnist_base(budget, T), "seed": seed}
    return _data_experiment(
        out_dir,
        DataExperiment(
            "fmnist-K",
            base,
            "leapfrog-steps",
            Ks,
            budget,
            PAPER_FMNIST,
            f"Fashion-MNIST, 10 iid clients, T = {T}, η = 1e-3 ({budget})",
            f"{budget} budget: T = {T}, {base['rounds']} rounds; η = 1e-3 for every K",
        ),
    )
