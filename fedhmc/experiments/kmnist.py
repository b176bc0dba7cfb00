"""``kmnist``: KMNIST logistic regression over a K grid (needs the KMNIST files)."""

from __future__ import annotations

from pathlib import Path

from fedhmc.experiments.fmnist import _mlp_like


def kmnist(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """KMNIST logistic regression, the K grid of the MLP experiment (needs the KMNIST files:
    ``--data-dir`` or ``FEDHMC_DATA``; the error says where it looked)."""
    return _mlp_like("kmnist", "kmnist", "logistic", out_dir, quick, seed, full)
