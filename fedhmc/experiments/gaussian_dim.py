"""``gaussian-dim``: rounds to reach W₂² < 0.1 against the dimension (the paper's Figure 2)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from fedhmc.core.progress import track
from fedhmc.experiments._common import ALGORITHM3_AS_PRINTED, _write
from fedhmc.viz.plots import new_figure


def gaussian_dim(out_dir: Path, *, quick: bool = False, seed: int = 0) -> dict:
    """Rounds to reach W₂² < 0.1 against the dimension d (the paper's §5.2, Figure 2).

    The heterogeneous Gaussian with 10 clients, K = 5, T = 10, η = 0.02 / d^{1/4}, ρ = 1,
    every chain started at θ̄_0 = 0. FA-HMC is linear-Gaussian here, so the law of θ̄_r is
    known exactly round by round (``fedhmc.analysis.gaussian.fahmc_gaussian_transient``) and
    W₂²(θ̄_r, posterior) = d ((m_r − m)² + (√v_r − √v)²) has no Monte Carlo error: the
    rounds needed are exact for every d. As a check that the sampler follows this law, it is
    also run with many chains at the smaller d, and its per-round mean and variance are
    compared with the exact ones (the largest deviation in Monte Carlo standard errors is
    reported; it should be of order 1–4).
    """
    from fedhmc.analysis.gaussian import fahmc_gaussian_transient
    from fedhmc.models.targets import hetero_gaussian

    dims = (2, 10, 100, 1000) if quick else (2, 5, 10, 20, 50, 100, 200, 500, 1000)
    check_dims = (2,) if quick else (2, 10, 50)
    chains = 200 if quick else 1000
    K, T, threshold, max_rounds = 5, 10, 0.1, 100_000
    rows = []
    for d in track(dims, "dimensions", "d"):
        target = hetero_gaussian(10, d, dtype=torch.float64)
        post = target.posterior()
        eta = 0.02 / d**0.25
        ms, vs = fahmc_gaussian_transient(
            target.means, target.variances, target.weights, eta, K, T, 1.0, max_rounds
        )
        w2sq = d * ((ms - post.mean) ** 2 + (vs**0.5 - post.var**0.5) ** 2)
        hit = [r for r in range(max_rounds) if w2sq[r] < threshold]
        rounds = hit[0] + 1 if hit else math.nan
        row = {
            "dim": d,
            "step_size": eta,
            "rounds": rounds,
            "rounds_squared": rounds**2,
            "rounds_per_sqrt_d": rounds / math.sqrt(d),
            "stationary_w2sq": float(w2sq[-1]),
            "max_dev_se": math.nan,
        }
        if d in check_dims and hit:
            law = (ms, vs)
            row["max_dev_se"] = _max_dev_se(target, (eta, K, T), chains, rounds, law, seed)
        rows.append(row)
    summary = {
        "experiment": "gaussian-dim",
        "protocol": ALGORITHM3_AS_PRINTED,
        "settings": {"clients": 10, "K": K, "T": T, "step_size": "0.02 / d^(1/4)"},
        "threshold_w2sq": threshold,
        "rows": rows,
    }
    _write(out_dir, "gaussian_dim", rows, summary)
    _plot(out_dir / "gaussian_dim.png", rows)
    return summary


def _max_dev_se(target, eta_k_t: tuple, chains: int, rounds: int, law: tuple, seed: int):
    """The sampler against the exact law ``law`` = (per-round means, variances): ``chains``
    chains of FA-HMC from 0 for ``rounds`` rounds; the largest deviation of the sample mean
    from the exact one, in Monte Carlo standard errors."""
    from fedhmc.algorithms import fahmc

    (eta, K, T), (ms, vs) = eta_k_t, law
    settings = fahmc.Settings(eta, K, T, rho=1.0)
    state = fahmc.init(torch.zeros(chains, target.dim, dtype=torch.float64), settings)
    worst = 0.0
    for r in range(1, rounds + 1):
        state, _ = fahmc.step(seed, state, target, settings)
        x = state.position.flatten()
        se = math.sqrt(vs[r - 1] / x.numel())
        worst = max(worst, abs(float(x.mean()) - ms[r - 1]) / se)
    return worst


def _plot(path: Path, rows: list[dict]) -> None:
    """The figure from the table's rows (those of ``gaussian_dim.json``): rounds² against d,
    and the rounds against d on log axes beside a √d line."""
    fig = new_figure(8.0, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    ds = [r["dim"] for r in rows]
    ax1.plot(ds, [r["rounds_squared"] for r in rows], "o-")
    ax1.set_xlabel("dimension d")
    ax1.set_ylabel("(rounds to W₂² < 0.1)²")
    ax1.set_title("rounds² against d (linear = rounds ∝ √d)", fontsize=9)
    ax2.loglog(ds, [r["rounds"] for r in rows], "o-", label="FA-HMC (exact)")
    ref = [rows[0]["rounds"] * math.sqrt(d / ds[0]) for d in ds]
    ax2.loglog(ds, ref, "k--", lw=0.8, label="∝ √d")
    lo, hi = min(r["rounds"] for r in rows), max(r["rounds"] for r in rows)
    ticks = [c * 10**k for k in range(6) for c in (1, 2, 5) if lo <= c * 10**k <= hi]
    if len(ticks) >= 2:  # plain round counts, 1-2-5 apart
        ax2.set_yticks(ticks, [f"{t:,}" for t in ticks])
        ax2.minorticks_off()
    ax2.set_xlabel("dimension d")
    ax2.set_ylabel("rounds to W₂² < 0.1")
    ax2.set_title("rounds against d (log axes)", fontsize=9)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
