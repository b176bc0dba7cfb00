"""What the image-classification presets share: the base settings of a Fashion-MNIST-like
run and the MLP preset's shape.
"""

from __future__ import annotations

from fedhmc.experiments._common import DataExperiment, _data_experiment


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


def _mlp_like(name, dataset, model, out_dir, quick, seed, full) -> dict:
    budget = "quick" if quick else "full" if full else "reduced"
    T = {"quick": 2, "reduced": 5, "full": 50}[budget]
    Ks = {"quick": [1, 10], "reduced": [1, 10], "full": [1, 10, 50, 100]}[budget]
    base = {**_fmnist_base(budget, T, model, dataset), "seed": seed}
    if budget == "reduced":
        base["rounds"] = 5
    return _data_experiment(
        out_dir,
        DataExperiment(
            name,
            base,
            "leapfrog-steps",
            Ks,
            budget,
            None,
            f"{dataset} {model}, 10 iid clients, T = {T} ({budget})",
            f"{budget} budget: T = {T}, {base['rounds']} rounds, K ∈ {Ks}; dataset default η",
        ),
    )
