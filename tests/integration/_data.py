"""Small data files that the integration tests write."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_image_clients(path: Path, num_clients: int) -> None:
    """``path``: a ``.npz`` of 120 noisy 1×8×8 images of 3 classes (90 to train, split
    round-robin over ``num_clients`` clients as ``client_train``, 30 to test)."""
    g = np.random.default_rng(0)
    y = g.integers(0, 3, 120)
    x = g.normal(size=(120, 1, 8, 8)).astype(np.float32) + y[:, None, None, None]
    np.savez(
        path,
        x_train=x[:90],
        y_train=y[:90],
        x_test=x[90:],
        y_test=y[90:],
        client_train=np.arange(90) % num_clients,
    )
