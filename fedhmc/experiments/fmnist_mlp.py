"""``fmnist-mlp``: the two-hidden-layer MLP on Fashion-MNIST over a K grid."""

from __future__ import annotations

from pathlib import Path

from fedhmc.experiments.fmnist import _mlp_like


def fmnist_mlp(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """The two-hidden-layer (100, 100) ReLU MLP on Fashion-MNIST, K grid at T = 50
    (``--full``: K ∈ {1, 10, 50, 100}, 200 rounds; reduced: K ∈ {1, 10}, T = 5, 5 rounds)."""
    return _mlp_like("fmnist-mlp", "fashion-mnist", "mlp", out_dir, quick, seed, full)
