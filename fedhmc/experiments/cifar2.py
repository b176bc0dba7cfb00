"""``cifar2``: CIFAR-2 logistic regression over a K grid (needs the CIFAR-10 batches)."""

from __future__ import annotations

from pathlib import Path

from fedhmc.experiments.fmnist import _mlp_like


def cifar2(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """CIFAR-2 (airplane vs automobile) logistic regression, the K grid of the MLP
    experiment (needs the CIFAR-10 python batches)."""
    return _mlp_like("cifar2", "cifar2", "logistic", out_dir, quick, seed, full)
