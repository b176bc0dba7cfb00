"""``stale-gaussian``: MSE of stale SGHMC against the staleness τ at L = L₀·τ (Chen et al.
§5.1).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from fedhmc.core.progress import track
from fedhmc.experiments._common import _write, write_csv
from fedhmc.viz.plots import new_figure


def stale_gaussian(out_dir: Path, *, quick: bool = False, seed: int = 0) -> dict:
    """Chen et al. (2016) §5.1: MSE of stale SG-MCMC against the staleness τ.

    Data d_i ~ N(θ*, 1), i = 1 … 1000, with θ* ~ N(0, 1) drawn from ``seed``; prior
    θ ~ N(0, 1), so the posterior is N(Σ d_i / 1001, 1/1001) and φ(θ) = θ² has the exact
    posterior expectation μ² + 1/1001. Minibatches of 10 (with replacement, counter RNG):
    ∇Ũ = (1000/10) Σ_{i∈S} (θ − d_i) + θ. For τ ∈ {1, 2, 5, 10, 15, 20} the chain runs
    L = L₀ τ steps with h = C τ^{−2/3} L^{−1/3}, C = 1/30, L₀ = 500, fixed staleness τ, from
    θ_0 = 0; φ̂_L is the average of φ over all L steps (no burn-in, as in the paper), and
    the MSE of φ̂_L is averaged over 200 chains.

    Sampler: the paper uses SGLD, but at these step sizes SGLD is unstable on this target
    (h·(n + 1) = 4.2 > 2 at τ = 1: our U is the sum over the data, the posterior's own
    scale). SGHMC with the Euler integrator is stable there (h·√(n + 1) ≈ 0.13), so this
    preset runs stale SGHMC with friction B = 2√(n + 1) (critical damping of the
    posterior's curvature) and reports what it finds.
    """
    from fedhmc.algorithms import stale
    from fedhmc.algorithms.oracles import from_grad
    from fedhmc.core import rng

    n, batch, C, L0 = 1000, 10, 1.0 / 30.0, 500
    taus = (1, 2, 5) if quick else (1, 2, 5, 10, 15, 20)
    chains = 50 if quick else 200
    gen = torch.Generator().manual_seed(seed)
    theta_true = float(torch.randn(1, generator=gen, dtype=torch.float64))
    data = theta_true + torch.randn(n, generator=gen, dtype=torch.float64)
    post_mean, post_var = float(data.sum()) / (n + 1), 1.0 / (n + 1)
    phi_bar = post_mean**2 + post_var
    friction = 2.0 * math.sqrt(n + 1)
    keys = stale.chain_keys(seed, chains)
    batch_keys = rng.derive(keys, 31)

    def grad(theta: torch.Tensor, step: int) -> torch.Tensor:
        u = rng.uniform(batch_keys, step, batch)  # (S, batch)
        idx = torch.clamp((u * n).to(torch.int64), max=n - 1)
        return (n / batch) * (theta - data[idx]).sum(-1, keepdim=True) + theta

    oracle = from_grad(grad)
    rows, curves = [], {}
    for tau in track(taus, "staleness", "δ"):
        row, curves[tau] = _stale_run(tau, oracle, phi_bar, chains, seed, friction, C, L0)
        rows.append(row)
    summary = {
        "experiment": "stale-gaussian",
        "sampler": f"stale SGHMC (Euler), friction {friction:.1f}, fixed staleness",
        "phi_bar": phi_bar,
        "settings": {"n": n, "batch": batch, "C": C, "L0": L0, "chains": chains},
        "rows": rows,
    }
    _write(out_dir, "stale_gaussian", rows, summary)
    curve_rows = [
        {"tau": tau, "iterations": x, "mse": y}
        for tau, (xs, ys) in curves.items()
        for x, y in zip(xs, ys, strict=True)
    ]
    write_csv(out_dir / "stale_gaussian_curves.csv", curve_rows)
    _plot(out_dir / "stale_gaussian.png", rows, curves)
    return summary


def _stale_run(tau: int, oracle, phi_bar: float, chains: int, seed: int, friction, C, L0):
    """One staleness τ: ``chains`` chains of stale SGHMC for L = L₀ τ steps at h =
    C τ^{−2/3} L^{−1/3}; the table row (the MSE of φ̂_L and its parts) and the MSE curve
    (iterations, MSE) at about 50 checkpoints."""
    from fedhmc.algorithms import stale

    L = L0 * tau
    h = C * tau ** (-2.0 / 3.0) * L ** (-1.0 / 3.0)
    settings = stale.Settings("sghmc", h, friction=friction, staleness=tau, local_steps=1)
    state = stale.init(torch.zeros(chains, 1, dtype=torch.float64), settings)
    total = torch.zeros(chains, dtype=torch.float64)
    checkpoints, mse_curve = [], []
    chunk = max(1, L // 50)
    t0 = time.perf_counter()
    done = 0
    while done < L:
        k = min(chunk, L - done)
        for _ in range(k):
            state, _ = stale.step(seed, state, oracle, settings)
            total += state.position[:, 0].square()
        done += k
        est = total / done
        checkpoints.append(done)
        mse_curve.append(float((est - phi_bar).square().mean()))
    est = total / L
    err = est - phi_bar
    row = {
        "tau": tau,
        "L": L,
        "step_size": h,
        "mse": float(err.square().mean()),
        "mse_se": float(err.square().std() / math.sqrt(chains)),
        "bias_sq": float(err.mean()) ** 2,
        "variance": float(est.var()),
        "wall_s": time.perf_counter() - t0,
    }
    return row, (checkpoints, mse_curve)


def _plot(path: Path, rows: list[dict], curves: dict) -> None:
    """The figure from the table's rows (``stale_gaussian.csv``) and the MSE curves (τ →
    (iterations, MSE) lists, from ``stale_gaussian_curves.csv``)."""
    fig = new_figure(8.0, 3.4)
    ax1, ax2 = fig.subplots(1, 2)
    for tau, (xs, ys) in curves.items():
        ax1.loglog(xs, ys, label=f"τ = {tau}")
    ax1.set_xlabel("iterations L")
    ax1.set_ylabel("MSE of the sample average of θ²")
    ax1.legend(fontsize=8)
    ax2.errorbar(
        [r["tau"] for r in rows],
        [r["mse"] for r in rows],
        yerr=[2 * r["mse_se"] for r in rows],
        fmt="o-",
    )
    ax2.set_yscale("log")
    ax2.set_xlabel("staleness τ (L = 500 τ)")
    ax2.set_ylabel("final MSE (±2 se)")
    fig.suptitle("Stale SGHMC on the Gaussian model of Chen et al. §5.1", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
