"""``fmnist-K``, ``fmnist-T``, ``fmnist-mlp``, ``kmnist``, ``cifar2``: image classification
presets under Algorithm 3.
"""

from __future__ import annotations

from pathlib import Path

from fedhmc.experiments._common import PAPER_FMNIST, _data_experiment


def _fmnist_base(budget: str, T: int, model: str = "logistic", dataset="fashion-mnist") -> dict:
    rounds = {"quick": 2, "reduced": 10, "full": 200}[budget]
    return {
        "dataset": dataset,
        "model": model,
        "num-clients": 10,
        "partition": "iid",
        "batch-size": 1000,
        "local-steps": T,
        "rounds": rounds,
        "burn-in": 0 if budget != "full" else 20,
    }


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
        "fmnist-K",
        out_dir,
        base,
        "leapfrog-steps",
        Ks,
        budget,
        PAPER_FMNIST,
        f"Fashion-MNIST, 10 iid clients, T = {T}, η = 1e-3 ({budget})",
        f"{budget} budget: T = {T}, {base['rounds']} rounds; η = 1e-3 for every K",
    )


def fmnist_t(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """Fashion-MNIST logistic regression, 10 iid clients, batch 1000: T ∈ {1, 10, 20, 50, 100}
    at K = 10, 200 rounds (``--full``). The reduced default runs T ∈ {1, 10, 20, 50} for 10
    rounds (about 5 minutes on 2 cores)."""
    budget = "quick" if quick else "full" if full else "reduced"
    Ts = {"quick": [1, 2], "reduced": [1, 10, 20, 50], "full": [1, 10, 20, 50, 100]}[budget]
    base = {**_fmnist_base(budget, 1), "leapfrog-steps": 10, "seed": seed}
    base.pop("local-steps")
    return _data_experiment(
        "fmnist-T",
        out_dir,
        base,
        "local-steps",
        Ts,
        budget,
        PAPER_FMNIST,
        f"Fashion-MNIST, 10 iid clients, K = 10, η = 1e-3 ({budget})",
        f"{budget} budget: {base['rounds']} rounds; η = 1e-3 for every T",
    )


def _mlp_like(name, dataset, model, out_dir, quick, seed, full) -> dict:
    budget = "quick" if quick else "full" if full else "reduced"
    T = {"quick": 2, "reduced": 5, "full": 50}[budget]
    Ks = {"quick": [1, 10], "reduced": [1, 10], "full": [1, 10, 50, 100]}[budget]
    base = {**_fmnist_base(budget, T, model, dataset), "seed": seed}
    if budget == "reduced":
        base["rounds"] = 5
    return _data_experiment(
        name,
        out_dir,
        base,
        "leapfrog-steps",
        Ks,
        budget,
        None,
        f"{dataset} {model}, 10 iid clients, T = {T} ({budget})",
        f"{budget} budget: T = {T}, {base['rounds']} rounds, K ∈ {Ks}; dataset default η",
    )


def fmnist_mlp(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """The two-hidden-layer (100, 100) ReLU MLP on Fashion-MNIST, K grid at T = 50
    (``--full``: K ∈ {1, 10, 50, 100}, 200 rounds; reduced: K ∈ {1, 10}, T = 5, 5 rounds)."""
    return _mlp_like("fmnist-mlp", "fashion-mnist", "mlp", out_dir, quick, seed, full)


def kmnist(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """KMNIST logistic regression, the K grid of the MLP experiment (needs the KMNIST files:
    ``--data-dir`` or ``FEDHMC_DATA``; the error says where it looked)."""
    return _mlp_like("kmnist", "kmnist", "logistic", out_dir, quick, seed, full)


def cifar2(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """CIFAR-2 (airplane vs automobile) logistic regression, the K grid of the MLP
    experiment (needs the CIFAR-10 python batches)."""
    return _mlp_like("cifar2", "cifar2", "logistic", out_dir, quick, seed, full)
