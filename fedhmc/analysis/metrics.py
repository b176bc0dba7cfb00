r"""Predictive and sample-quality metrics.

Predictive metrics take the Bayesian-model-average class probabilities P (M × C, rows
sum to one), or their logarithms, and integer labels y (M,):

- accuracy: mean of $\mathbb{1}[\arg\max_k P_{mk} = y_m]$;
- Brier score: mean over m of $\sum_k (P_{mk} - \mathbb{1}[k = y_m])^2$ (multi-class sum, in
  [0, 2]);
- ECE: equal-width bins (15 by default; ``--ece-bins``) over the confidence
  $\max_k P_{mk}$, each bin (lo, hi];
  $\sum_b \frac{|b|}{M} |\mathrm{accuracy}(b) - \mathrm{confidence}(b)|$;
- NLL: $-\log P_{m, y_m}$, as the mean per test point and as the sum.

Sample-quality metrics compare samples with a reference:

- marginal error $\mathrm{ME} = \frac1d \sum_i W_1(\mu_i, \nu_i)$, 1-D Wasserstein-1 between the
  i-th marginals;
- W₂ between Gaussians N(m₁, Σ₁) and N(m₂, Σ₂).
"""

from __future__ import annotations

import math

import torch

ECE_BINS = 15


def accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of rows whose most probable class is the label."""
    labels = labels.to(probs.device)
    return float((probs.argmax(-1) == labels).to(torch.float64).mean())


def brier(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over rows of Σ_k (P_k − 1[k = y])²."""
    p = probs.to(torch.float64)
    onehot = torch.nn.functional.one_hot(labels.to(p.device), p.shape[-1]).to(torch.float64)
    return float((p - onehot).square().sum(-1).mean())


def ece(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> float:
    """Expected calibration error with ``bins`` equal-width confidence bins (lo, hi].

    The confidences and bins are computed on ``probs``' device; each bin's sums are then
    taken on the CPU, adding the test points in their order. A GPU adds into a bin with
    atomic operations, in an order that changes from run to run, so its ECE would change
    in the last bits; on the CPU the same confidences give the same ECE on every device
    and in every run.
    """
    p = probs.to(torch.float64)
    conf, pred = p.max(-1)
    correct = (pred == labels.to(p.device)).to(torch.float64)
    idx = (torch.ceil(conf * bins) - 1).clamp_(0, bins - 1)  # (small integers, exact)
    idx, correct, conf = torch.stack((idx, correct, conf)).cpu()  # one copy to the host
    idx = idx.long()
    acc_sum = conf.new_zeros(bins).index_add_(0, idx, correct)
    conf_sum = conf.new_zeros(bins).index_add_(0, idx, conf)
    return float((acc_sum - conf_sum).abs().sum() / p.shape[0])


def nll(log_probs: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    r"""(mean, sum) of $-\log P_{m, y_m}$, from log-probabilities."""
    lp = log_probs.to(torch.float64)
    lp = lp.gather(-1, labels.to(lp.device).view(-1, 1)).squeeze(-1)
    return float(-lp.mean()), float(-lp.sum())


def predictive_metrics(
    log_probs: torch.Tensor, labels: torch.Tensor, ece_bins: int = ECE_BINS
) -> dict[str, float]:
    """accuracy, brier, ece (over ``ece_bins`` bins), nll_mean and nll_sum of a predictive
    given as log-probabilities."""
    probs = log_probs.to(torch.float64).exp()
    labels = labels.to(probs.device)
    nll_mean, nll_sum = nll(log_probs, labels)
    return {
        "accuracy": accuracy(probs, labels),
        "brier": brier(probs, labels),
        "ece": ece(probs, labels, ece_bins),
        "nll_mean": nll_mean,
        "nll_sum": nll_sum,
    }


class BMAPredictive:
    """Streaming Bayesian-model-average predictive, kept as log-probabilities.

    After k samples it holds log((1/k) Σ_j p_j), updated as a running mean in log space
    (``logaddexp``), so no sample is stored and no probability underflows to zero.
    """

    def __init__(self) -> None:
        self.count = 0
        self.log_probs: torch.Tensor | None = None

    def update(self, log_probs: torch.Tensor) -> torch.Tensor:
        """Add samples: ``log_probs`` is (S, M, C) for S samples (or (M, C) for one)."""
        lp = log_probs.to(torch.float64)
        if lp.dim() == 2:
            lp = lp.unsqueeze(0)
        s = lp.shape[0]
        batch = torch.logsumexp(lp, dim=0) - math.log(s)
        if self.log_probs is None:
            self.log_probs = batch
        else:
            k = self.count
            self.log_probs = torch.logaddexp(
                self.log_probs + math.log(k / (k + s)), batch + math.log(s / (k + s))
            )
        self.count += s
        return self.log_probs


def mean_of_chains(log_probs: torch.Tensor) -> torch.Tensor:
    """log of the mean over the leading (chain) dimension of probabilities."""
    lp = log_probs.to(torch.float64)
    return torch.logsumexp(lp, dim=0) - math.log(lp.shape[0])


def wasserstein1_marginals(samples: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """W₁ between the empirical marginals of each coordinate, (..., d).

    ``samples`` is (..., n₁, d), with any leading batch dimensions (each batch entry is
    compared with the same reference, sorted once), and ``reference`` (n₂, d); the sample
    sizes may differ. W₁ = ∫₀¹ |F₁⁻¹(u) − F₂⁻¹(u)| du, exact: the quantile functions are
    steps at the multiples of 1/n₁ and 1/n₂, so the integral is a sum over their merged
    grid, which does not depend on the values.
    """
    a = samples.to(torch.float64).transpose(-1, -2).sort(-1).values  # (..., d, n1)
    b = reference.to(a.device, torch.float64).T.sort(-1).values  # (d, n2)
    n1, n2 = a.shape[-1], b.shape[-1]
    # The grid's points in units of 1/(n1 n2): i n2 and j n1; each interval ends at one.
    dev = a.device
    ends = torch.cat(
        [torch.arange(1, n1 + 1, device=dev) * n2, torch.arange(1, n2 + 1, device=dev) * n1]
    ).unique()
    widths = ends.diff(prepend=ends.new_zeros(1)).to(torch.float64) / (n1 * n2)
    ia = (ends + n2 - 1) // n2 - 1  # the quantile of a on the interval
    ib = (ends + n1 - 1) // n1 - 1
    bq = b[:, ib]
    rows = a.reshape(-1, *a.shape[-2:])  # one batch entry at a time: (d, n1 + n2) each
    out = torch.stack([((x[:, ia] - bq).abs() * widths).sum(-1) for x in rows])
    return out.reshape(a.shape[:-1])


def marginal_error(samples: torch.Tensor, reference: torch.Tensor) -> torch.Tensor | float:
    """ME = (1/d) Σ_i W₁(μ_i, ν_i) between samples (n₁, d) and reference samples (n₂, d);
    samples (..., n₁, d) with leading batch dimensions give a tensor of MEs (...)."""
    me = wasserstein1_marginals(samples, reference).mean(-1)
    return float(me) if me.ndim == 0 else me


def _sqrtm_psd(a: torch.Tensor) -> torch.Tensor:
    """Square root of symmetric PSD matrices (..., d, d)."""
    vals, vecs = torch.linalg.eigh(a)
    return (vecs * vals.clamp(min=0.0).sqrt().unsqueeze(-2)) @ vecs.transpose(-1, -2)


def gaussian_w2_sq(m1, cov1, m2, cov2) -> torch.Tensor:
    r"""W₂² between N(m₁, Σ₁) and N(m₂, Σ₂), batched over leading dimensions (float64).

    $$
    W_2^2 = \|m_1 - m_2\|^2 + \operatorname{tr}\left(\Sigma_1 + \Sigma_2
    - 2 (\Sigma_2^{1/2} \Sigma_1 \Sigma_2^{1/2})^{1/2}\right).
    $$
    """
    # On the device of the first tensor given (the samples' statistics), references too.
    given = [x for x in (m1, cov1, m2, cov2) if isinstance(x, torch.Tensor)]
    device = given[0].device if given else torch.device("cpu")
    m1, m2 = (torch.as_tensor(x, dtype=torch.float64, device=device) for x in (m1, m2))
    c1 = torch.as_tensor(cov1, dtype=torch.float64, device=device)
    c2 = torch.as_tensor(cov2, dtype=torch.float64, device=device)
    r2 = _sqrtm_psd(c2)
    cross = _sqrtm_psd(r2 @ c1 @ r2)
    trace = torch.diagonal(c1 + c2 - 2.0 * cross, dim1=-2, dim2=-1).sum(-1)
    return (m1 - m2).square().sum(-1) + trace


def gaussian_w2(m1, cov1, m2, cov2) -> float:
    """W₂ between N(m₁, Σ₁) and N(m₂, Σ₂) (see
    [`gaussian_w2_sq`][fedhmc.analysis.metrics.gaussian_w2_sq])."""
    return math.sqrt(max(float(gaussian_w2_sq(m1, cov1, m2, cov2)), 0.0))


def gaussian_w2_diag(samples: torch.Tensor, mean: float, var: float) -> tuple[float, float]:
    """W₂ and mean error of samples (S, d) against the isotropic Gaussian N(mean·1, var·I).

    The samples are summarised by their per-coordinate mean and variance (a diagonal
    Gaussian fit, exact for FA-HMC on isotropic targets, whose coordinates are independent),
    so W₂² = Σ_i (m̂_i − mean)² + Σ_i (σ̂_i − √var)². The mean error is ‖m̂ − mean·1‖₂.
    With one sample the variance is undefined and W₂ is NaN.
    """
    x = samples.to(torch.float64)
    m_hat = x.mean(0)
    mean_err = float((m_hat - mean).norm())
    if x.shape[0] < 2:
        return math.nan, mean_err
    sd_hat = x.var(0, unbiased=True).sqrt()
    w2sq = (m_hat - mean).square().sum() + (sd_hat - math.sqrt(var)).square().sum()
    return math.sqrt(float(w2sq)), mean_err
