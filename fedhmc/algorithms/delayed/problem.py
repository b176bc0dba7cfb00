"""The regression problem of Kungurtsev et al. §3.2: a 4th-degree polynomial with a known
coefficient vector, Gaussian noise and prior, so a Gaussian posterior in closed form.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from fedhmc.algorithms.oracles import OneClient
from fedhmc.core import rng
from fedhmc.errors import ConfigError


@dataclass(frozen=True)
class Regression(OneClient):
    """Polynomial regression y = Σ_{j=0}^{degree} β_j x^j + ε, ε ~ N(0, noise_var), with
    prior β ~ N(0, prior_std² I): a one-client [`Target`][fedhmc.models.protocols.Target].

    ``features`` (n, degree + 1) holds 1, x, …, x^degree; ``coef`` is the true β.
    """

    features: torch.Tensor
    targets: torch.Tensor
    coef: torch.Tensor
    noise_var: float
    prior_std: float
    batch_size: int = 0
    """Minibatch size of ``grad`` (0 or ≥ n: the full data), drawn with replacement."""

    dtype = torch.float64

    @property
    def weights(self) -> torch.Tensor:
        return torch.ones(1, dtype=torch.float64)

    def with_batch_size(self, batch_size: int) -> Regression:
        """The same problem, its ``grad`` at another minibatch size."""
        return dataclasses.replace(self, batch_size=int(batch_size))

    def grad(self, theta, keys, index, need_energy=True):
        """The gradient oracle: ∇Ũ at positions (R, 1, d), chain r's minibatch of
        evaluation ``index`` drawn from ``keys[r]``; no energies."""
        return gradient(self, theta[:, 0], keys[:, 0], index, self.batch_size).unsqueeze(1), None

    @property
    def n(self) -> int:
        return int(self.features.shape[0])

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])


def make_regression(
    n: int = 1000,
    *,
    degree: int = 4,
    noise_var: float = 0.1,
    prior_std: float = 1.0,
    seed: int = 0,
) -> Regression:
    """A polynomial regression data set with a known coefficient vector.

    x_i ~ Uniform(−1, 1), β ~ N(0, I) (drawn from ``seed``), y_i = φ(x_i)ᵀβ + ε_i with
    ε_i ~ N(0, noise_var) and φ(x) = (1, x, …, x^degree). The default is the paper's
    setting: a linear layer with 4 inputs (x, …, x⁴) and a bias, noise variance 0.1.
    """
    if int(n) < 1:
        raise ConfigError(f"the regression needs at least one data point, got n = {n}")
    if int(degree) < 0:
        raise ConfigError(f"degree must be ≥ 0, got {degree}")
    if not (noise_var > 0 and math.isfinite(noise_var)):
        raise ConfigError(f"noise variance must be positive and finite, got {noise_var}")
    if not (prior_std > 0):
        raise ConfigError(f"prior std must be positive (inf for a flat prior), got {prior_std}")
    gen = torch.Generator().manual_seed(int(seed))
    coef = torch.randn(degree + 1, generator=gen, dtype=torch.float64)
    x = torch.rand(n, generator=gen, dtype=torch.float64) * 2.0 - 1.0
    features = torch.stack([x**j for j in range(degree + 1)], dim=1)
    eps = torch.randn(n, generator=gen, dtype=torch.float64) * math.sqrt(noise_var)
    return Regression(features, features @ coef + eps, coef, float(noise_var), float(prior_std))


def posterior(problem: Regression, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of the target exp(−U/τ), U(β) = ‖y − Φβ‖²/(2s²) + ‖β‖²/(2σ₀²).

    With A = ΦᵀΦ/s² + I/σ₀² (the Hessian of U): mean A⁻¹Φᵀy/s², covariance τA⁻¹.
    """
    phi, s2 = problem.features, problem.noise_var
    prec = phi.T @ phi / s2 + torch.eye(problem.dim, dtype=phi.dtype) / problem.prior_std**2
    chol = torch.linalg.cholesky(prec)
    mean = torch.cholesky_solve((phi.T @ problem.targets / s2).unsqueeze(1), chol).squeeze(1)
    cov = temperature * torch.cholesky_inverse(chol)
    return mean, 0.5 * (cov + cov.T)


def hessian_eigs(problem: Regression) -> tuple[float, float]:
    """Smallest and largest eigenvalue (m, L) of the Hessian of U."""
    phi = problem.features
    prec = phi.T @ phi / problem.noise_var
    prec = prec + torch.eye(problem.dim, dtype=phi.dtype) / problem.prior_std**2
    e = torch.linalg.eigvalsh(prec)
    return float(e[0]), float(e[-1])


def gradient(
    problem: Regression, x: torch.Tensor, batch_keys: torch.Tensor, j: int, batch: int
) -> torch.Tensor:
    """Minibatch gradient of U at x (R, d), chain r's batch drawn from ``batch_keys[r]``, j.

    (n/B) Σ_{i∈S} −φ_i (y_i − φ_iᵀx)/s² + x/σ₀², with S drawn with replacement; B = 0 or
    B ≥ n uses the full data.
    """
    phi, y, n = problem.features, problem.targets, problem.n
    if batch == 0 or batch >= n:
        resid = y.unsqueeze(0) - x @ phi.T  # (R, n)
        g = -(resid @ phi) / problem.noise_var
    else:
        u = rng.uniform(batch_keys, j, batch)  # (R, B)
        idx = torch.clamp((u * n).to(torch.int64), max=n - 1)
        pb = phi[idx]  # (R, B, d)
        resid = y[idx] - torch.einsum("rbd,rd->rb", pb, x)
        g = -(n / batch) * torch.einsum("rbd,rb->rd", pb, resid) / problem.noise_var
    return g + x / problem.prior_std**2
