r"""Convergence diagnostics across chains: rank-normalised split R̂ and bulk ESS.

Draws are arrays shaped (n, m) — n draws of m chains — or (n, m, D), with one result per
coordinate. Torch tensors and numpy arrays are both accepted; the work is done in float64
numpy and the results are numpy arrays of shape ``x.shape[2:]`` (0-d for (n, m) input).

Formulas (Vehtari, Gelman, Simpson, Carpenter & Bürkner 2021, "Rank-normalization,
folding, and localization: an improved R̂", Bayesian Analysis 16(2)):

- **Split.** Each chain is cut into its first and second half (the middle draw of an odd
  n is dropped), giving 2m chains of n' = ⌊n/2⌋ draws; a trend within a chain then shows
  up as disagreement between its halves.
- **Rank normalisation.** All 2m·n' = N draws of a coordinate are ranked together
  (ties get their average rank r) and mapped to z = Φ⁻¹((r − 3/8) / (N + 1/4)) (Blom).
  This makes R̂ and ESS well defined for heavy tails and invariant to monotone maps.
- **R̂ of z.** With chain means z̄_j, chain variances s_j² (divisor n' − 1),
  W = mean_j s_j², B/n' = var_j(z̄_j) (divisor 2m − 1) and
  var⁺ = (n' − 1)/n' · W + B/n', R̂ = √(var⁺ / W).
- **Folding.** The same R̂ of the rank-normalised |x − median(x)| detects chains that
  agree in location but differ in scale. The reported R̂ is max(bulk R̂, folded R̂).
- **Bulk ESS.** The ESS of the rank-normalised split chains: per-chain autocovariances
  $\gamma_{t,j}$ by FFT (zero-padded, divisor n'), combined as
  $\rho_t = 1 - (W - \mathrm{mean}_j\, \gamma_{t,j}) / \mathrm{var}^+$ with $\gamma_{0,j}$
  taken with divisor n' − 1 as in Stan; Geyer's initial positive sequence sums the pairs
  $\Gamma_k = \rho_{2k} + \rho_{2k+1}$ up to the first $\Gamma_k \le 0$ and makes them
  non-increasing (initial monotone sequence), over at most ⌊(n' − 3)/2⌋ pairs as ArviZ
  does; $\tau = -1 + 2 \sum_k \Gamma_k$ (+ $\rho_{2K}$ of the first pair not summed when
  positive, Stan's
  correction); ESS = N / max(τ, 1 / log₁₀ N).

Why our own functions rather than ArviZ: ArviZ would pull a heavy dependency tree
(xarray, pandas, netCDF/h5 backends) into the core for two formulas of a few dozen lines.
It is an optional extra (``fedhmc export``), and ``tests/unit/test_export.py`` checks that
``az.summary`` gives the same R̂ and bulk ESS; ``tests/unit/test_diagnostics.py`` checks the
formulas on cases with known answers (iid draws, AR(1) chains, shifted and rescaled chains,
invariance to monotone maps).
"""

from __future__ import annotations

import math

import numpy as np
import torch

ArrayLike = np.ndarray | torch.Tensor


def _as_draws(x: ArrayLike) -> np.ndarray:
    """(n, m) or (n, m, D) draws as a float64 (n, m, D) array."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().to(torch.float64).numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3:
        raise ValueError(f"draws must be shaped (draws, chains[, D]), got {a.shape}")
    if a.shape[0] < 4 or a.shape[1] < 1:
        raise ValueError(f"diagnostics need at least 4 draws and 1 chain, got {a.shape[:2]}")
    return a


def _shape_out(x: ArrayLike, out: np.ndarray) -> np.ndarray:
    """``out`` (D,) reshaped to the per-coordinate shape of the input ``x``: () or (D,)."""
    shape = tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
    return np.asarray(out).reshape(shape[2:])


def split_chains(draws: ArrayLike) -> np.ndarray:
    """Cut every chain into two halves: (n, m, D) → (⌊n/2⌋, 2m, D).

    With odd n the middle draw is dropped.
    """
    a = _as_draws(draws)
    half = a.shape[0] // 2
    return np.concatenate([a[:half], a[a.shape[0] - half :]], axis=1)


def rank_normalize(a: np.ndarray) -> np.ndarray:
    """Blom-normal scores of the pooled ranks of each coordinate of (n, m, D) draws.

    z = Φ⁻¹((r − 3/8) / (N + 1/4)) with r the average rank (ties share it) among all
    N = n·m draws of the coordinate.
    """
    n, m, D = a.shape
    N = n * m
    cols = np.ascontiguousarray(a.reshape(N, D).T)  # (D, N): sort along contiguous rows
    order = np.argsort(cols, axis=1)
    s = np.take_along_axis(cols, order, axis=1)
    rank_sorted = np.broadcast_to(np.arange(1.0, N + 1.0), (D, N))
    tied = s[:, 1:] == s[:, :-1]
    if tied.any():
        # Ties share their average 1-based rank, (first + last) / 2 + 1 over the run of
        # tied sorted positions; runs are found with running max / min of their bounds.
        pos = np.arange(N)
        starts = np.ones_like(s, dtype=bool)
        starts[:, 1:] = ~tied
        ends = np.ones_like(s, dtype=bool)
        ends[:, :-1] = ~tied
        first = np.maximum.accumulate(np.where(starts, pos, 0), axis=1)
        last = np.minimum.accumulate(np.where(ends, pos, N)[:, ::-1], axis=1)[:, ::-1]
        rank_sorted = 0.5 * (first + last) + 1.0
    ranks = np.empty_like(cols)
    np.put_along_axis(ranks, order, rank_sorted, axis=1)
    u = torch.from_numpy(((ranks - 0.375) / (N + 0.25)).T.reshape(n, m, D).copy())
    return torch.special.ndtri(u).numpy()


def _rhat_raw(a: np.ndarray) -> np.ndarray:
    """Classic R̂ of (n, m, D) chains (no splitting, no ranks), (D,)."""
    n, m, _ = a.shape
    W = a.var(axis=0, ddof=1).mean(axis=0)
    B_over_n = a.mean(axis=0).var(axis=0, ddof=1) if m > 1 else np.zeros_like(W)
    var_plus = (n - 1) / n * W + B_over_n
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(var_plus / W)


def split_rhat(draws: ArrayLike) -> np.ndarray:
    """Rank-normalised split R̂ per coordinate: max of the bulk and the folded R̂.

    Parameters
    ----------
    draws
        (n, m) or (n, m, D) draws, n ≥ 4.

    Returns
    -------
    numpy.ndarray
        R̂ ≥ 1 (up to rounding) of shape ``draws.shape[2:]``; NaN for a constant
        coordinate. Values below 1.01 indicate agreement of all half-chains.
    """
    return _shape_out(draws, _rhat_of_split(split_chains(draws)))


def _rhat_of_split(a: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
    """max(bulk, folded) R̂ of split chains ``a``, given their normal scores ``z`` if known."""
    bulk = _rhat_raw(rank_normalize(a) if z is None else z)
    folded = np.abs(a - np.median(a.reshape(-1, a.shape[2]), axis=0))
    return np.maximum(bulk, _rhat_raw(rank_normalize(folded)))


def _autocov(a: np.ndarray) -> np.ndarray:
    """Autocovariances γ_t (divisor n) of each chain and coordinate by FFT, (n, m, D)."""
    n = a.shape[0]
    centred = a - a.mean(axis=0, keepdims=True)
    size = 1 << (2 * n - 1).bit_length()  # zero padding: no circular wrap-around
    f = np.fft.rfft(centred, n=size, axis=0)
    return np.fft.irfft(f * np.conj(f), n=size, axis=0)[:n] / n


def _ess_raw(a: np.ndarray) -> np.ndarray:
    """ESS of (n, m, D) chains, Geyer initial monotone sequence, (D,)."""
    n, m, _ = a.shape
    acov = _autocov(a)
    W = (acov[0] * n / (n - 1)).mean(axis=0)
    B_over_n = a.mean(axis=0).var(axis=0, ddof=1) if m > 1 else np.zeros_like(W)
    var_plus = (n - 1) / n * W + B_over_n
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (W - acov.mean(axis=1)) / var_plus  # (n, D)
    rho[0] = 1.0
    # Pairs Γ_k for k < P = ⌊(n − 3)/2⌋ can be summed in full; the sum stops at the first
    # Γ_k ≤ 0 or at k = P, whose even term ρ_{2k} is then added when positive (Stan's
    # correction). The bound P is ArviZ's (its loop runs while 2k − 1 < n − 3), so that
    # the two agree to rounding also for chains too short for the pairs to turn negative.
    P = (n - 3) // 2
    pairs = rho[0 : 2 * P : 2] + rho[1 : 2 * P : 2]  # Γ_k, (P, D)
    positive = np.cumprod(pairs > 0, axis=0).astype(bool)  # before the first Γ_k ≤ 0
    mono = np.minimum.accumulate(np.where(positive, pairs, np.inf), axis=0)
    tau = -1.0 + 2.0 * np.where(positive, mono, 0.0).sum(axis=0)
    K = positive.sum(axis=0)  # the first pair not summed in full: a Γ_k ≤ 0, or P
    nxt = rho[2 * K, np.arange(rho.shape[1])]
    tau = tau + np.where(nxt > 0, nxt, 0.0)
    N = n * m
    return N / np.maximum(tau, 1.0 / math.log10(max(N, 10)))


def ess(draws: ArrayLike) -> np.ndarray:
    """Bulk effective sample size per coordinate (rank-normalised split chains).

    Parameters
    ----------
    draws
        (n, m) or (n, m, D) draws, n ≥ 4.

    Returns
    -------
    numpy.ndarray
        ESS of shape ``draws.shape[2:]``: about n·m for independent draws, n·m·(1 − φ)/(1 + φ)
        for AR(1) chains with coefficient φ; at most n·m·log₁₀(n·m) (antithetic chains).
    """
    a = split_chains(draws)
    return _shape_out(draws, _ess_raw(rank_normalize(a)))


def ess_tail(draws: ArrayLike) -> np.ndarray:
    """Tail effective sample size per coordinate (Vehtari et al. 2021, §4.3): the smaller
    ESS of the indicators I(x ≤ q₀.₀₅) and I(x ≥ q₀.₉₅) on split chains; it governs the
    Monte Carlo error of the 5 % and 95 % quantiles."""
    a = _as_draws(draws)
    flat = a.reshape(-1, a.shape[2])
    lo, hi = np.quantile(flat, 0.05, axis=0), np.quantile(flat, 0.95, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        e_lo = _ess_raw(split_chains((a <= lo).astype(np.float64)))
        e_hi = _ess_raw(split_chains((a >= hi).astype(np.float64)))
    return _shape_out(draws, np.minimum(e_lo, e_hi))


def per_parameter(samples: ArrayLike) -> dict[str, np.ndarray]:
    """Split R̂, bulk ESS and tail ESS of every coordinate of (n, m, D) draws."""
    a = _as_draws(samples)
    with np.errstate(divide="ignore", invalid="ignore"):
        return {"rhat": split_rhat(a), "ess_bulk": ess(a), "ess_tail": ess_tail(a)}


RHAT_WARN = 1.01
"""R̂ above this means the chains have not mixed (Vehtari et al. 2021)."""
ESS_PER_CHAIN_WARN = 100
"""Bulk or tail ESS below this many per chain is too few for reliable summaries."""
RELIABLE_DRAWS = 100
"""Draws per chain below which R̂ and ESS are too noisy to judge convergence by (Stan's rule
of thumb: about 100 draws a chain). With fewer, a run and ``fedhmc diagnose`` say so
instead of reporting the figures as a verdict."""


def too_short(diag: dict) -> bool:
    """Whether ``convergence_summary``'s result comes from chains too short to judge."""
    return int(diag.get("draws", 0)) < RELIABLE_DRAWS


def short_note(draws: int) -> str:
    """Why ``draws`` draws per chain are too few to judge by R̂ and ESS, in a few words."""
    return (
        f"{draws} draws per chain; R-hat and ESS need about {RELIABLE_DRAWS}, so their "
        "figures are unreliable"
    )


def warning(diag: dict) -> str | None:
    """The one-line convergence warning for ``convergence_summary``'s result, or None: the
    chains are too short to judge, every parameter stayed constant, or R̂ or ESS fail."""
    m = int(diag.get("chains", 0))
    if m < 2:
        return None
    if not math.isfinite(diag.get("rhat_max", math.nan)):
        return (
            "every parameter kept one value over all draws: the chains did not move, so "
            "R-hat and ESS are undefined"
        )
    if too_short(diag):
        note = short_note(int(diag["draws"]))
        return f"the chains are too short to judge convergence ({note}); run more rounds"
    need = ESS_PER_CHAIN_WARN * m
    problems = []
    r = diag["rhat_max"]
    if r > RHAT_WARN:
        problems.append(f"R-hat {r:.3f} > {RHAT_WARN}")
    for key, name in (("ess_min", "bulk"), ("ess_tail_min", "tail")):
        e = diag.get(key, math.nan)
        if math.isfinite(e) and e < need:
            problems.append(f"{name} ESS {e:.0f} < {need} ({ESS_PER_CHAIN_WARN} per chain)")
    if not problems:
        return None
    return (
        f"the chains have not converged ({'; '.join(problems)}); run more rounds or more "
        "chains before trusting the summaries (fedhmc diagnose RUN_DIR names the parameters)"
    )


def summary_rows(diag: dict) -> list[tuple[str, str]]:
    """The rows of the end-of-run table on R̂ and ESS: their figures, or, for chains too
    short to judge, one row that says so."""
    if too_short(diag):
        n = int(diag["draws"])
        return [
            (
                "R-hat, ESS",
                f"not shown: unreliable with {n} draws per chain (need ~{RELIABLE_DRAWS})",
            )
        ]
    return [
        ("R-hat max", f"{diag['rhat_max']:.3f} (split, across chains)"),
        ("ESS min", f"{diag['ess_min']:.1f} (median {diag['ess_median']:.1f})"),
    ]


def ess_basic(draws: ArrayLike) -> np.ndarray:
    """Effective sample size of the raw (not rank-normalised) split chains.

    This is the ESS that governs the Monte Carlo standard error of a posterior mean, sd / √ESS
    (Vehtari et al. 2021, §3.2); the bulk [`ess`][fedhmc.analysis.diagnostics.ess] measures the same
    for rank-based (quantile) summaries and is robust to heavy tails.
    """
    return _shape_out(draws, _ess_raw(split_chains(draws)))


def mcse_mean(draws: ArrayLike) -> np.ndarray:
    """Monte Carlo standard error of the mean of each coordinate: sd / √(basic ESS)."""
    a = _as_draws(draws)
    sd = a.reshape(-1, a.shape[2]).std(axis=0, ddof=1)
    return _shape_out(draws, sd / np.sqrt(_ess_raw(split_chains(a))))


def convergence_summary(samples: ArrayLike) -> dict:
    """Worst-case diagnostics over the coordinates of (n, m[, D]) draws.

    Returns
    -------
    dict
        ``rhat_max`` (largest rank-normalised split R̂), ``ess_min`` and ``ess_median``
        (bulk ESS over coordinates), ``ess_tail_min`` (smallest tail ESS), ``draws`` (n)
        and ``chains`` (m). With fewer than `RELIABLE_DRAWS` draws per chain the figures
        are too noisy to judge convergence by (`too_short`). Constant
        coordinates (NaN R̂) are ignored; all-constant draws give NaN.
    """
    a = _as_draws(samples)
    halves = split_chains(a)
    z = rank_normalize(halves)
    r, e = _rhat_of_split(halves, z), _ess_raw(z)
    finite = np.isfinite(r)
    if not finite.any():
        return {
            "rhat_max": math.nan,
            "ess_min": math.nan,
            "ess_median": math.nan,
            "ess_tail_min": math.nan,
            "draws": int(a.shape[0]),
            "chains": int(a.shape[1]),
        }
    with np.errstate(divide="ignore", invalid="ignore"):
        t = ess_tail(a)
    return {
        "rhat_max": float(r[finite].max()),
        "ess_min": float(e[finite].min()),
        "ess_median": float(np.median(e[finite])),
        "ess_tail_min": float(np.nanmin(np.where(finite, t, np.nan))),
        "draws": int(a.shape[0]),
        "chains": int(a.shape[1]),
    }
