"""``fmnist-cnn``: a LeNet-5 on Fashion-MNIST, FA-HMC (K = 10) against FA-LD (K = 1).

The convolutional network goes through the generic ``torch.func`` path that samples any
``nn.Module`` (``--model cnn``); the comparison is the paper's, at its T = 50 local
iterations per round.
"""

from __future__ import annotations

from pathlib import Path

from fedhmc.experiments._common import DataExperiment, _data_experiment

STEP_SIZE = 1e-3
"""η of every cell: one round of K = 10, T = 10 at B = 32 reached accuracy 0.69 at 1e-3 (the
networks' preset, 5e-4, is the MLP's, tuned at B = 1000)."""

CNN_BUDGETS = {
    # budget: (T, rounds, burn-in, batch per client)
    "quick": (2, 2, 0, 16),
    "reduced": (50, 5, 1, 32),
    "full": (50, 200, 20, 1000),
}


def fmnist_cnn(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """LeNet-5 on Fashion-MNIST over 10 iid clients, K ∈ {1, 10} at T = 50.

    Reduced (default): 5 rounds, minibatches of 32 per client (about a minute on 2 CPU
    cores; a round of K = 10 takes 550 gradient evaluations of every client);
    ``--full``: 200 rounds at the Fashion-MNIST preset's minibatch of 1000 (days on a CPU;
    meant for a GPU). Every cell writes the four metrics per round.
    """
    budget = "quick" if quick else "full" if full else "reduced"
    T, rounds, burn_in, batch = CNN_BUDGETS[budget]
    base = {
        "dataset": "fashion-mnist",
        "model": "cnn",
        "num-clients": 10,
        "partition": "iid",
        "batch-size": batch,
        "local-steps": T,
        "rounds": rounds,
        "burn-in": burn_in,
        "step-size": STEP_SIZE,
        "seed": seed,
    }
    return _data_experiment(
        out_dir,
        DataExperiment(
            "fmnist-cnn",
            base,
            "leapfrog-steps",
            [1, 10],
            budget,
            None,
            f"Fashion-MNIST LeNet-5, 10 iid clients, T = {T}, B = {batch} ({budget})",
            f"{budget} budget: T = {T}, {rounds} rounds (burn-in {burn_in}), minibatch {batch} per "
            f"client, K ∈ [1, 10] (K = 1: FA-LD), η = {STEP_SIZE}",
        ),
    )
