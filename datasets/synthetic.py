"""Simulated Bayesian logistic regression data (``blr-synthetic``).

Liang et al. (2024, FA-HMC, Section 5.1) sample the posterior of a Bayesian logistic regression
on "a simulated dataset of dimension d = 1000 (Mangoubi and Vishnoi, 2018)" of 1000 examples,
split equally over 20 clients (and d = 10 in a second experiment). The paper does not say how
the data are generated, so we use the standard generator, exactly:

* true coefficients ``theta* ~ N(0, I_d)`` (no intercept);
* features ``x_i ~ N(0, I_d / d)``, i.i.d. (entries N(0, 1/d), so ``||x_i|| ~= 1`` and the logit
  ``x_i . theta*`` is about N(0, 1): labels are informative but noisy, not separable by design);
* labels ``y_i ~ Bernoulli(sigmoid(x_i . theta*))`` in {0, 1}.

Train and test examples are drawn independently from the same model. ``theta*``, the training
set and the test set use three independent streams spawned from ``numpy.random.SeedSequence(
seed)``, so the training set does not change with the test size, and ``theta*`` does not
change with either size. Features are returned unscaled (the loader standardises them only
when asked to).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhmc.errors import ConfigError


@dataclass(frozen=True)
class BLRData:
    """Simulated logistic-regression data and the coefficients that generated it."""

    X_train: np.ndarray  # float32, (num_examples, dim)
    y_train: np.ndarray  # int64 in {0, 1}
    X_test: np.ndarray  # float32, (num_test, dim)
    y_test: np.ndarray
    theta_star: np.ndarray  # float64, (dim,)


def check_positive_int(label: str, value: object) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{label} must be a positive integer, got {value!r}")
    return int(value)


def _draw(rng: np.random.Generator, n: int, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = theta.shape[0]
    X = rng.standard_normal((n, d)) / np.sqrt(d)
    prob = 0.5 * (1.0 + np.tanh(0.5 * (X @ theta)))  # sigmoid, without overflow
    y = (rng.random(n) < prob).astype(np.int64)
    return X.astype(np.float32), y


def make_blr_synthetic(
    *, dim: int = 1000, num_examples: int = 1000, num_test: int = 1000, seed: int = 0
) -> BLRData:
    """Simulate Bayesian logistic regression data (see the module docstring for the model).

    Parameters
    ----------
    dim : int
        Number of features d (1000 in Liang et al. 2024; 10 in their second experiment).
    num_examples : int
        Number of training examples n (1000 in Liang et al. 2024).
    num_test : int
        Number of test examples.
    seed : int
        Seed; equal seeds give identical data.

    Returns
    -------
    BLRData
        Features ``(n, d)`` float32 with entries ~ N(0, 1/d), labels in {0, 1}, and theta*.
    """
    for label, value in (("dim", dim), ("num_examples", num_examples), ("num_test", num_test)):
        check_positive_int(label, value)
    rng_theta, rng_train, rng_test = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    theta = rng_theta.standard_normal(dim)
    X_train, y_train = _draw(rng_train, num_examples, theta)
    X_test, y_test = _draw(rng_test, num_test, theta)
    return BLRData(X_train, y_train, X_test, y_test, theta)
