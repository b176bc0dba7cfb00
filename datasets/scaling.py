"""Feature scaling shared by the loaders.

``scaling`` is one of:

``"standardize"``
    Images: pixels to [0, 1] first. Then every feature is centred and divided by its standard
    deviation, both computed on the TRAINING set only (population std, ddof=0) and applied to
    train and test alike. A feature whose training std is (numerically) zero is divided by 1
    instead, so nothing becomes NaN.
``"unit"``
    Images: pixels divided by their maximum value (255, or 16 for ``digits``) into [0, 1].
    Tabular features: left as they are.
``"symmetric"``
    Images: pixels to [-1, 1], (x / max − 0.5) / 0.5 (what the FA-HMC authors' experiment
    code does). Tabular features: mapped to [-1, 1] by the training set's per-feature
    minimum and maximum (a constant feature becomes 0).
``"none"``
    Features left as they are (pixels stay 0..255), converted to float32.
"""

from __future__ import annotations

import numpy as np
import torch

from fedhmc.errors import ConfigError

FEATURE_SCALINGS = ("standardize", "unit", "symmetric", "none")


def check_scaling(scaling: str) -> str:
    """Return ``scaling`` if valid, else raise `ConfigError`."""
    if scaling not in FEATURE_SCALINGS:
        raise ConfigError(
            f"unknown scaling {scaling!r}; choose one of {', '.join(FEATURE_SCALINGS)}"
        )
    return scaling


def scale_features(
    X_train: np.ndarray,
    X_test: np.ndarray,
    scaling: str,
    *,
    pixel_max: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Flatten, scale and convert features to float32 tensors.

    Parameters
    ----------
    X_train, X_test : np.ndarray
        Features, ``(n, ...)``; flattened to ``(n, F)``.
    scaling : {"standardize", "unit", "none"}
        See the module docstring.
    pixel_max : float, optional
        The largest pixel value for image data (255 for 8-bit images); ``None`` for tabular
        data, which ``"unit"`` leaves unchanged.

    Returns
    -------
    X_train, X_test : torch.Tensor
        float32, ``(n, F)``.
    description : str
        A short phrase saying what was done, e.g. ``"pixels/255, standardised with train
        mean/std"``.
    """
    check_scaling(scaling)
    Xtr = np.asarray(X_train).reshape(len(X_train), -1).astype(np.float32)
    Xte = np.asarray(X_test).reshape(len(X_test), -1).astype(np.float32)
    steps = []
    if scaling != "none" and pixel_max is not None:
        Xtr /= np.float32(pixel_max)
        Xte /= np.float32(pixel_max)
        steps.append(f"pixels/{pixel_max:g}")
    if scaling == "symmetric":
        if pixel_max is not None:
            Xtr = (Xtr - np.float32(0.5)) / np.float32(0.5)
            Xte = (Xte - np.float32(0.5)) / np.float32(0.5)
            steps.append("then (x − 0.5)/0.5 into [-1, 1]")
        else:
            lo, hi = Xtr.min(axis=0), Xtr.max(axis=0)
            span = np.where(hi > lo, hi - lo, np.float32(1.0)).astype(np.float32)
            mid = ((hi + lo) / 2).astype(np.float32)
            Xtr = (Xtr - mid) / (span / 2)
            Xte = (Xte - mid) / (span / 2)
            steps.append("features to [-1, 1] by the training min and max")
    if scaling == "standardize":
        mean = Xtr.mean(axis=0, dtype=np.float64)
        std = Xtr.std(axis=0, dtype=np.float64)
        std[std <= 1e-8 * np.maximum(1.0, np.abs(mean))] = 1.0
        mean32, std32 = mean.astype(np.float32), std.astype(np.float32)
        Xtr = (Xtr - mean32) / std32
        Xte = (Xte - mean32) / std32
        steps.append("standardised with train mean/std (constant features: std set to 1)")
    if not steps:
        steps.append(f"pixels left as 0..{pixel_max:g}" if pixel_max else "features unscaled")
    return torch.from_numpy(Xtr), torch.from_numpy(Xte), ", ".join(steps)
