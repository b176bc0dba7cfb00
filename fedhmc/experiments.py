"""The papers' experiments as commands: ``fedhmc experiment NAME``.

Each experiment is a function ``(out_dir, *, quick=False, seed=0) -> dict`` that writes a
CSV table, a JSON summary and a PNG plot to ``out_dir`` and returns the table. ``quick``
shrinks it to seconds (what the tests run).
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .delayed import delayed_sgld_experiment
from .errors import ConfigError

ALGORITHM3 = "algorithm3: the paper's Algorithm 3 as printed (--protocol algorithm3)"
"""What the FA-HMC experiments that are not ``paper-*`` run; their summaries say so."""


def _write(out_dir: Path, name: str, rows: list[dict], summary: dict) -> None:
    from .output import write_csv_atomic, write_text_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(out_dir / f"{name}.csv", rows)
    write_text_atomic(out_dir / f"{name}.json", json.dumps(summary, indent=2) + "\n")


def _figure(width: float = 6.0, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


# ----------------------------------------------------------------- debiased-gaussian
def debiased_gaussian(out_dir: Path, *, quick: bool = False, seed: int = 0) -> dict:
    """Stationary bias of plain and debiased FA-HMC on the heterogeneous Gaussian.

    The paper's §5.2 target with 4 clients ((μ, s²) = (20, 1) for two, (1, 2) for two;
    exact posterior N(41/3 · 1, 4/3 · I)), K = 5, η = 0.02, ρ = 1, exact gradients, for
    T ∈ {10, 50, 200}. For each T and variant it runs many chains until they forget their
    start (the exact contraction per round is known), then averages θ̄ over chains,
    coordinates and further rounds: the estimate of the stationary mean. Its bias against
    the posterior mean is reported with a Monte Carlo standard error (from the spread of
    per-chain time averages), next to the exact stationary bias from
    :func:`fedhmc.targets.fahmc_gaussian_stationary`.
    """
    from .sampler import SamplerSettings, debiased_round, run_round
    from .targets import fahmc_gaussian_stationary, hetero_gaussian

    chains, dim = (400, 2) if quick else (500, 10)
    Ts = (10, 50) if quick else (10, 50, 200)
    K, eta = 5, 0.02
    target = hetero_gaussian(4, dim, dtype=torch.float64)
    post = target.posterior()
    rows = []
    for T in Ts:
        settings = SamplerSettings(eta, K, T, rho=1.0)
        for variant in ("fahmc", "fahmc-debiased"):
            debiased = variant == "fahmc-debiased"
            exact_mean, exact_var, radius = fahmc_gaussian_stationary(
                target.means, target.variances, target.weights, eta, K, T, 1.0, debiased=debiased
            )
            burn = int(math.ceil(math.log(1e-4 / 20) / math.log(radius)))
            collect = max(20, burn // 2) if not quick else 10
            theta = torch.zeros(chains, dim, dtype=torch.float64)
            anchor, acc = None, torch.zeros(chains, dim, dtype=torch.float64)
            t0 = time.perf_counter()
            for r in range(1, burn + collect + 1):
                if debiased:
                    theta, anchor, _ = debiased_round(
                        target, target, theta, anchor, seed, r, settings
                    )
                else:
                    theta, _ = run_round(target, theta, seed, r, settings)
                if r > burn:
                    acc += theta
            per_chain = (acc / collect).mean(1)  # independent across chains
            est = float(per_chain.mean())
            se = float(per_chain.std() / math.sqrt(chains))
            rows.append(
                {
                    "T": T,
                    "algorithm": variant,
                    "rounds": burn + collect,
                    "bias": est - post.mean,
                    "bias_se": se,
                    "exact_bias": exact_mean - post.mean,
                    "exact_var": exact_var,
                    "posterior_var": post.var,
                    "wall_s": time.perf_counter() - t0,
                }
            )
    summary = {
        "experiment": "debiased-gaussian",
        "protocol": ALGORITHM3,
        "posterior_mean": post.mean,
        "posterior_var": post.var,
        "settings": {"K": K, "step_size": eta, "rho": 1.0, "chains": chains, "dim": dim},
        "rows": rows,
    }
    _write(out_dir, "debiased_gaussian", rows, summary)
    fig = _figure()
    ax = fig.add_subplot()
    for variant, color in (("fahmc", "tab:red"), ("fahmc-debiased", "tab:blue")):
        sel = [r for r in rows if r["algorithm"] == variant]
        ts = [r["T"] for r in sel]
        ax.plot(ts, [r["exact_bias"] for r in sel], "-", color=color, label=f"{variant}, exact")
        ax.errorbar(
            ts,
            [r["bias"] for r in sel],
            yerr=[2 * r["bias_se"] for r in sel],
            fmt="o",
            color=color,
            label=f"{variant}, measured (±2 se)",
        )
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("T (local iterations per round)")
    ax.set_ylabel("stationary mean − posterior mean")
    ax.set_title("Heterogeneous Gaussian, 4 clients, K = 5, η = 0.02", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "debiased_gaussian.png", dpi=120)
    return summary


# ---------------------------------------------------------------------- gaussian-dim
def gaussian_dim(out_dir: Path, *, quick: bool = False, seed: int = 0) -> dict:
    """Rounds to reach W₂² < 0.1 against the dimension d (the paper's §5.2, Figure 2).

    The heterogeneous Gaussian with 10 clients, K = 5, T = 10, η = 0.02 / d^{1/4}, ρ = 1,
    every chain started at θ̄_0 = 0. FA-HMC is linear-Gaussian here, so the law of θ̄_r is
    known exactly round by round (:func:`fedhmc.targets.fahmc_gaussian_transient`) and
    W₂²(θ̄_r, posterior) = d ((m_r − m)² + (√v_r − √v)²) has no Monte Carlo error: the
    rounds needed are exact for every d. As a check that the sampler follows this law, it is
    also run with many chains at the smaller d, and its per-round mean and variance are
    compared with the exact ones (the largest deviation in Monte Carlo standard errors is
    reported; it should be of order 1–4).
    """
    from .sampler import SamplerSettings, run_round
    from .targets import fahmc_gaussian_transient, hetero_gaussian

    dims = (2, 10, 100, 1000) if quick else (2, 5, 10, 20, 50, 100, 200, 500, 1000)
    check_dims = (2,) if quick else (2, 10, 50)
    chains = 200 if quick else 1000
    K, T, threshold, max_rounds = 5, 10, 0.1, 100_000
    rows = []
    for d in dims:
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
            settings = SamplerSettings(eta, K, T, rho=1.0)
            theta = torch.zeros(chains, d, dtype=torch.float64)
            worst = 0.0
            for r in range(1, rounds + 1):
                theta, _ = run_round(target, theta, seed, r, settings)
                x = theta.flatten()
                se = math.sqrt(vs[r - 1] / x.numel())
                worst = max(worst, abs(float(x.mean()) - ms[r - 1]) / se)
            row["max_dev_se"] = worst
        rows.append(row)
    summary = {
        "experiment": "gaussian-dim",
        "protocol": ALGORITHM3,
        "settings": {"clients": 10, "K": K, "T": T, "step_size": "0.02 / d^(1/4)"},
        "threshold_w2sq": threshold,
        "rows": rows,
    }
    _write(out_dir, "gaussian_dim", rows, summary)
    fig = _figure(8.0, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    ds = [r["dim"] for r in rows]
    ax1.plot(ds, [r["rounds_squared"] for r in rows], "o-")
    ax1.set_xlabel("dimension d")
    ax1.set_ylabel("(rounds to W₂² < 0.1)²")
    ax1.set_title("rounds² against d (linear = rounds ∝ √d)", fontsize=9)
    ax2.loglog(ds, [r["rounds"] for r in rows], "o-", label="FA-HMC (exact)")
    ref = rows[0]["rounds"] * (torch.tensor(ds, dtype=torch.float64) / ds[0]) ** 0.5
    ax2.loglog(ds, ref.tolist(), "k--", lw=0.8, label="∝ √d")
    ax2.set_xlabel("dimension d")
    ax2.set_ylabel("rounds to W₂² < 0.1")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "gaussian_dim.png", dpi=120)
    return summary


# ------------------------------------------------------------- data experiments
PAPER_FMNIST = {"accuracy": 0.847, "brier": 0.219, "ece": 0.008, "nll_sum": 4332.0}
"""The paper's Fashion-MNIST logistic-regression results after 200 rounds (best settings)."""

BUDGETS = ("quick", "reduced", "full")


def run_cells(out_dir: Path, base: dict, cells: list[dict], progress: bool = True) -> list[dict]:
    """Run each cell (``base`` updated by the cell) on the engine into ``out_dir/cells/``.

    A cell whose ``summary.json`` says completed is read back instead of rerun, so an
    interrupted experiment resumes where it stopped. Returns the tidy rows: one per
    (cell, round), with the cell's settings and the round's metrics.
    """
    from .config import RunConfig
    from .engine import run

    rows: list[dict] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(cells), desc="cells", unit="cell", disable=None, leave=False)
    for cell in cells:
        name = "_".join(f"{k}={v}" for k, v in cell.items())
        cell_dir = out_dir / "cells" / name
        cfg = RunConfig.from_mapping({**base, **cell, "out": str(cell_dir)})
        summary_path = cell_dir / "summary.json"
        done = summary_path.exists() and json.loads(summary_path.read_text())["status"] == (
            "completed"
        )
        from .sweep import same_run_settings

        if done and same_run_settings(
            json.loads((cell_dir / "config.json").read_text()),
            json.loads(json.dumps(cfg.resolve().to_dict(), default=str)),
        ):
            with open(cell_dir / "metrics.csv") as f:
                history = [{k: _num(v) for k, v in r.items()} for r in csv.DictReader(f)]
        else:
            from .engine import prepare, resume_or_replace

            history = run(resume_or_replace(prepare(cfg)), progress=False).history
        rows += [{**cell, **h} for h in history]
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return rows


def _num(v: str):
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def _metric_panels(rows: list[dict], hue: str, title: str, path: Path, paper: dict | None):
    metrics = [m for m in ("accuracy", "brier", "ece", "nll_sum") if m in rows[0]]
    fig = _figure(3.2 * len(metrics), 3.2)
    axes = fig.subplots(1, len(metrics))
    values = sorted({r[hue] for r in rows})
    for ax, m in zip(axes, metrics, strict=True):
        for v in values:
            sel = [r for r in rows if r[hue] == v]
            ax.plot([r["round"] for r in sel], [r[m] for r in sel], label=f"{hue} = {v}")
        if paper and m in paper:
            ax.axhline(paper[m], color="k", ls="--", lw=0.8, label="paper, 200 rounds")
        ax.set_xlabel("communication round")
        ax.set_title(m, fontsize=10)
        if m == "nll_sum":
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)
    fig.savefig(path.with_suffix(".pdf"))


def _data_experiment(
    name: str,
    out_dir: Path,
    base: dict,
    hue: str,
    values: list,
    budget: str,
    paper: dict | None,
    title: str,
    note: str,
) -> dict:
    cells = [{hue: v} for v in values]
    rows = run_cells(out_dir, base, cells)
    file = name.replace("-", "_")
    _write(out_dir, file, rows, {})
    last = max(r["round"] for r in rows)
    final = [r for r in rows if r["round"] == last]
    keep = (hue, "round", "accuracy", "brier", "ece", "nll_mean", "nll_sum", "wall_s")
    table = [{k: r[k] for k in keep if k in r} for r in final]
    summary = {
        "experiment": name,
        "protocol": ALGORITHM3,
        "budget": budget,
        "base": base,
        "note": note,
        "paper_200_rounds": paper,
        "rows": table,
    }
    from .output import write_text_atomic

    write_text_atomic(out_dir / f"{file}.json", json.dumps(summary, indent=2) + "\n")
    _metric_panels(rows, hue, title, out_dir / file, paper)
    return summary


def _fmnist_base(budget: str, T: int, model: str = "logistic", dataset="fashion-mnist") -> dict:
    rounds = {"quick": 2, "reduced": 10, "full": 200}[budget]
    return {
        "dataset": dataset,
        "model": model,
        "num-clients": 10,
        "partition": "iid",
        "batch-size": 1000,
        "local-steps": T,
        "rounds": rounds,
        "burn-in": 0 if budget != "full" else 20,
    }


def fmnist_k(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """Fashion-MNIST logistic regression, 10 iid clients, batch 1000: K ∈ {1, 10, 50, 100}
    at T = 50, 200 rounds (``--full``). The reduced default runs T = 5 and 10 rounds (about
    5 minutes on 2 cores). η = 1e-3 (the dataset default) for every K; the paper tuned η per
    setting."""
    budget = "quick" if quick else "full" if full else "reduced"
    T = {"quick": 2, "reduced": 5, "full": 50}[budget]
    Ks = [1, 10] if quick else [1, 10, 50, 100]
    base = {**_fmnist_base(budget, T), "seed": seed}
    return _data_experiment(
        "fmnist-K",
        out_dir,
        base,
        "leapfrog-steps",
        Ks,
        budget,
        PAPER_FMNIST,
        f"Fashion-MNIST, 10 iid clients, T = {T}, η = 1e-3 ({budget})",
        f"{budget} budget: T = {T}, {base['rounds']} rounds; η = 1e-3 for every K",
    )


def fmnist_t(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """Fashion-MNIST logistic regression, 10 iid clients, batch 1000: T ∈ {1, 10, 20, 50, 100}
    at K = 10, 200 rounds (``--full``). The reduced default runs T ∈ {1, 10, 20, 50} for 10
    rounds (about 5 minutes on 2 cores)."""
    budget = "quick" if quick else "full" if full else "reduced"
    Ts = {"quick": [1, 2], "reduced": [1, 10, 20, 50], "full": [1, 10, 20, 50, 100]}[budget]
    base = {**_fmnist_base(budget, 1), "leapfrog-steps": 10, "seed": seed}
    base.pop("local-steps")
    return _data_experiment(
        "fmnist-T",
        out_dir,
        base,
        "local-steps",
        Ts,
        budget,
        PAPER_FMNIST,
        f"Fashion-MNIST, 10 iid clients, K = 10, η = 1e-3 ({budget})",
        f"{budget} budget: {base['rounds']} rounds; η = 1e-3 for every T",
    )


def _mlp_like(name, dataset, model, out_dir, quick, seed, full) -> dict:
    budget = "quick" if quick else "full" if full else "reduced"
    T = {"quick": 2, "reduced": 5, "full": 50}[budget]
    Ks = {"quick": [1, 10], "reduced": [1, 10], "full": [1, 10, 50, 100]}[budget]
    base = {**_fmnist_base(budget, T, model, dataset), "seed": seed}
    if budget == "reduced":
        base["rounds"] = 5
    return _data_experiment(
        name,
        out_dir,
        base,
        "leapfrog-steps",
        Ks,
        budget,
        None,
        f"{dataset} {model}, 10 iid clients, T = {T} ({budget})",
        f"{budget} budget: T = {T}, {base['rounds']} rounds, K ∈ {Ks}; dataset default η",
    )


def fmnist_mlp(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """The two-hidden-layer (100, 100) ReLU MLP on Fashion-MNIST, K grid at T = 50
    (``--full``: K ∈ {1, 10, 50, 100}, 200 rounds; reduced: K ∈ {1, 10}, T = 5, 5 rounds)."""
    return _mlp_like("fmnist-mlp", "fashion-mnist", "mlp", out_dir, quick, seed, full)


def kmnist(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """KMNIST logistic regression, the K grid of the MLP experiment (needs the KMNIST files:
    ``--data-dir`` or ``FEDHMC_DATA``; the error says where it looked)."""
    return _mlp_like("kmnist", "kmnist", "logistic", out_dir, quick, seed, full)


def cifar2(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """CIFAR-2 (airplane vs automobile) logistic regression, the K grid of the MLP
    experiment (needs the CIFAR-10 python batches)."""
    return _mlp_like("cifar2", "cifar2", "logistic", out_dir, quick, seed, full)


# ------------------------------------------------------------------ stale gradients
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
    from . import rng
    from .sgmcmc import StaleSettings, advance, chain_keys, init_state

    n, batch, C, L0 = 1000, 10, 1.0 / 30.0, 500
    taus = (1, 2, 5) if quick else (1, 2, 5, 10, 15, 20)
    chains = 50 if quick else 200
    gen = torch.Generator().manual_seed(seed)
    theta_true = float(torch.randn(1, generator=gen, dtype=torch.float64))
    data = theta_true + torch.randn(n, generator=gen, dtype=torch.float64)
    post_mean, post_var = float(data.sum()) / (n + 1), 1.0 / (n + 1)
    phi_bar = post_mean**2 + post_var
    friction = 2.0 * math.sqrt(n + 1)
    keys = chain_keys(seed, chains)
    batch_keys = rng.derive(keys, 31)

    def grad(theta: torch.Tensor, step: int) -> torch.Tensor:
        u = rng.uniform(batch_keys, step, batch)  # (S, batch)
        idx = torch.clamp((u * n).to(torch.int64), max=n - 1)
        return (n / batch) * (theta - data[idx]).sum(-1, keepdim=True) + theta

    rows, curves = [], {}
    for tau in taus:
        L = L0 * tau
        h = C * tau ** (-2.0 / 3.0) * L ** (-1.0 / 3.0)
        settings = StaleSettings("sghmc", h, friction=friction, staleness=tau)
        state = init_state(torch.zeros(chains, 1, dtype=torch.float64), settings)
        total = torch.zeros(chains, dtype=torch.float64)
        checkpoints, mse_curve = [], []
        chunk = max(1, L // 50)
        t0 = time.perf_counter()
        done = 0
        while done < L:
            k = min(chunk, L - done)
            for _ in range(k):
                state = advance(state, grad, 1, settings, keys)
                total += state.theta[:, 0].square()
            done += k
            est = total / done
            checkpoints.append(done)
            mse_curve.append(float((est - phi_bar).square().mean()))
        est = total / L
        err = est - phi_bar
        rows.append(
            {
                "tau": tau,
                "L": L,
                "step_size": h,
                "mse": float(err.square().mean()),
                "mse_se": float(err.square().std() / math.sqrt(chains)),
                "bias_sq": float(err.mean()) ** 2,
                "variance": float(est.var()),
                "wall_s": time.perf_counter() - t0,
            }
        )
        curves[tau] = (checkpoints, mse_curve)
    summary = {
        "experiment": "stale-gaussian",
        "sampler": f"stale SGHMC (Euler), friction {friction:.1f}, fixed staleness",
        "phi_bar": phi_bar,
        "settings": {"n": n, "batch": batch, "C": C, "L0": L0, "chains": chains},
        "rows": rows,
    }
    _write(out_dir, "stale_gaussian", rows, summary)
    fig = _figure(9.0, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    for tau, (xs, ys) in curves.items():
        ax1.loglog(xs, ys, label=f"τ = {tau}")
    ax1.set_xlabel("iterations L")
    ax1.set_ylabel("MSE of the sample average of θ²")
    ax1.legend(fontsize=7)
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
    fig.savefig(out_dir / "stale_gaussian.png", dpi=120)
    return summary


def stale_variance(out_dir: Path, *, quick: bool = False, seed: int = 0) -> dict:
    """Chen et al. (2016) §5.1: variance of the sample-average test loss against iterations
    per worker, for W workers whose gradients are stale by W − 1.

    Bayesian logistic regression on scikit-learn's breast-cancer data (the paper's a9a is
    not available offline), pooled, prior N(0, I), minibatch 32. W asynchronous workers in
    round-robin order are modelled as one chain with fixed staleness τ = W − 1 that makes W
    updates per worker iteration: after L̄ iterations per worker the chain has taken W·L̄
    steps. The test function is the mean test-set logistic loss of the current sample; φ̂
    is its running average over the steps after a common burn-in, and its variance across
    100 chains is reported against L̄. Sampler: SGLD, h = 2e-5 (small enough to stay
    stable at τ = 15). Theory: the variance does not depend on τ, so at the same L̄ it
    falls about W times faster: a linear speed-up in W.
    """
    from .config import RunConfig
    from .problem import build_problem
    from .sgmcmc import StaleSettings, advance, chain_keys, init_state, target_grad_fn

    workers = (1, 2, 4) if quick else (1, 2, 4, 8, 16)
    per_worker = 100 if quick else 1000
    burn = 200 if quick else 2000
    chains = 20 if quick else 100
    h = 2e-5
    cfg = RunConfig(
        dataset="breast-cancer",
        algorithm="sgld",
        batch_size=32,
        chains=chains,
        seed=seed,
        prior_std=0.1,
    ).resolve()
    problem = build_problem(cfg)
    target, model = problem.target, problem.model
    X_test, y_test = problem.evaluator.X, problem.evaluator.y
    keys = chain_keys(seed, chains)
    grad = target_grad_fn(target, keys)

    def test_loss(theta: torch.Tensor) -> torch.Tensor:
        lp = model.log_probs(theta, X_test.to(theta.dtype))  # (S, M, C)
        return -lp.gather(-1, y_test.view(1, -1, 1).expand(theta.shape[0], -1, 1)).mean((1, 2))

    warm = StaleSettings("sgld", h)
    start = advance(init_state(torch.zeros(chains, target.dim), warm), grad, burn, warm, keys)
    rows, curves = [], {}
    for W in workers:
        settings = StaleSettings("sgld", h, staleness=W - 1)
        state = init_state(start.theta, settings)
        state.step = start.step
        total = torch.zeros(chains, dtype=torch.float64)
        xs, ys = [], []
        t0 = time.perf_counter()
        for step in range(1, W * per_worker + 1):
            state = advance(state, grad, 1, settings, keys)
            total += test_loss(state.theta).to(torch.float64)
            if step % W == 0 and (step // W) % max(1, per_worker // 20) == 0:
                xs.append(step // W)
                ys.append(float((total / step).var()))
        curves[W] = (xs, ys)
        rows.append(
            {
                "workers": W,
                "staleness": W - 1,
                "iterations_per_worker": per_worker,
                "variance": ys[-1],
                "wall_s": time.perf_counter() - t0,
            }
        )
    base = rows[0]["variance"]
    for r in rows:
        r["variance_ratio_vs_W1"] = base / r["variance"]
    summary = {
        "experiment": "stale-variance",
        "data": "breast-cancer (a9a is not available offline)",
        "sampler": f"SGLD, h = {h:g}, minibatch 32, staleness W − 1",
        "rows": rows,
    }
    _write(out_dir, "stale_variance", rows, summary)
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot()
    for W, (xs, ys) in curves.items():
        ax.loglog(xs, ys, label=f"W = {W}")
    ax.set_xlabel("iterations per worker L̄")
    ax.set_ylabel("variance of the sample-average test loss")
    ax.set_title("Stale SGLD, breast-cancer BLR: variance against L̄", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "stale_variance.png", dpi=120)
    return summary


# ---------------------------------------------------------------- simulated BLR
def blr_config(dim: int, chains: int, seed: int, K: int, eta: float, **extra):
    """The simulated-BLR setting of the paper's Figure 1: 20 iid clients, full-batch
    gradients, K leapfrog steps of size η (resolved)."""
    from .config import RunConfig

    return RunConfig(
        dataset="blr-synthetic",
        dim=dim,
        num_clients=20,
        partition="iid",
        batch_size=0,
        leapfrog_steps=K,
        step_size=eta,
        chains=chains,
        seed=seed,
        **extra,
    ).resolve()


def blr_reference(cfg, *, chains: int, warmup: int, samples: int, cache: Path | None = None):
    """MHMC reference draws (chains·samples, D) of a blr-synthetic config's posterior, and
    the sampler's info; cached as .npy/.json under ``cache`` keyed by the settings."""
    import hashlib

    import numpy as np

    from .mhmc import mhmc, pooled_energy
    from .problem import build_problem

    key = json.dumps(
        [
            cfg.dataset,
            cfg.model,
            cfg.dim,
            cfg.prior_std,
            cfg.scaling,
            cfg.seed,
            cfg.temperature,
            chains,
            warmup,
            samples,
            "mhmc-v1",
        ]
    )
    stem = "reference-" + hashlib.sha1(key.encode()).hexdigest()[:12]
    if cache is not None and (cache / f"{stem}.npy").exists():
        info = json.loads((cache / f"{stem}.json").read_text())
        return torch.as_tensor(np.load(cache / f"{stem}.npy")), info
    problem = build_problem(cfg.replace(dtype="float64"))
    theta0 = torch.zeros(chains, problem.dim, dtype=torch.float64)
    t0 = time.perf_counter()
    draws, info = mhmc(
        pooled_energy(problem.target),
        theta0,
        samples,
        num_warmup=warmup,
        leapfrog_steps=20,
        step_size=0.05,
        seed=cfg.seed,
    )
    info = {
        "accept_rate": info["accept_rate"],
        "step_size_mean": float(info["step_size"].mean()),
        "divergences": info["divergences"],
        "chains": chains,
        "warmup": warmup,
        "samples": samples,
        "wall_s": time.perf_counter() - t0,
    }
    flat = draws.reshape(-1, problem.dim).to(torch.float32)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f"{stem}.tmp.npy"
        np.save(tmp, flat.numpy())
        tmp.replace(cache / f"{stem}.npy")
        (cache / f"{stem}.json").write_text(json.dumps(info, indent=2))
    return flat, info


def _blr_eta(name, out_dir, quick, seed, full, dim, noises) -> dict:
    import numpy as np

    from .config import RunConfig
    from .engine import run
    from .metrics import marginal_error

    budget = "quick" if quick else "full" if full else "reduced"
    etas = {
        "quick": [0.05, 0.1],
        "reduced": [0.02, 0.05, 0.1],
        "full": [0.002, 0.005, 0.01, 0.02, 0.05, 0.1],
    }[budget]
    rounds, chains = {"quick": (6, 4), "reduced": (20, 8), "full": (200, 8)}[budget]
    base = RunConfig(
        dataset="blr-synthetic",
        dim=dim,
        num_clients=20,
        partition="iid",
        local_steps=10,
        batch_size=0,
        rounds=rounds,
        burn_in=rounds // 2,
        chains=chains,
        seed=seed,
        save_samples=True,
    )
    ref_sizes = {"quick": (4, 100, 50), "reduced": (8, 300, 200), "full": (16, 1000, 1000)}
    rc, rw, rs = ref_sizes[budget]
    from fedhmc_datasets.locate import cache_dir

    reference, ref_info = blr_reference(
        base.resolve(), chains=rc, warmup=rw, samples=rs, cache=cache_dir() / "reference"
    )
    rows = []
    for noise in noises:
        for eta in etas:
            for algo in ("fahmc", "fald"):
                K = max(1, math.floor(math.pi / (3 * eta))) if algo == "fahmc" else 1
                cell = out_dir / "cells" / f"{algo}-eta{eta:g}-noise{noise:g}"
                cfg = base.replace(
                    algorithm=algo,
                    step_size=eta,
                    grad_noise=noise,
                    out=str(cell),
                    leapfrog_steps=K if algo == "fahmc" else None,
                )
                t0 = time.perf_counter()
                result = run(cfg, progress=False)
                samples = torch.as_tensor(np.load(cell / "samples.npy"))
                rows.append(
                    {
                        "algorithm": algo,
                        "grad_noise": noise,
                        "step_size": eta,
                        "leapfrog_steps": K,
                        "me": marginal_error(samples.reshape(-1, samples.shape[-1]), reference),
                        "accuracy": result.final.get("accuracy"),
                        "nll_mean": result.final.get("nll_mean"),
                        "wall_s": time.perf_counter() - t0,
                    }
                )
    summary = {
        "experiment": name,
        "protocol": ALGORITHM3,
        "budget": budget,
        "dim": dim,
        "clients": 20,
        "T": 10,
        "rounds": rounds,
        "chains": chains,
        "K_rule": "FA-HMC K = floor(pi / (3 eta)) at every eta (the paper tunes K above 0.01)",
        "reference": ref_info,
        "rows": rows,
    }
    file = name.replace("-", "_")
    _write(out_dir, file, rows, summary)
    fig = _figure(4.5 * len(noises), 3.6)
    axes = fig.subplots(1, len(noises), squeeze=False)[0]
    for ax, noise in zip(axes, noises, strict=True):
        for algo, label in (("fahmc", "FA-HMC"), ("fald", "FA-LD")):
            sel = [r for r in rows if r["algorithm"] == algo and r["grad_noise"] == noise]
            ax.plot([r["step_size"] for r in sel], [r["me"] for r in sel], "o-", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("step size η")
        ax.set_ylabel("marginal error (ME)")
        ax.set_title(
            f"d = {dim}, {'exact' if noise == 0 else f'σ_g = {noise:g}'} gradients", fontsize=9
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / f"{file}.png", dpi=120)
    return summary


def blr_eta(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """FA-HMC (K = ⌊π/(3η)⌋) against FA-LD over η on the simulated BLR (the paper's
    Figure 1a, b): d = 1000, n = 1000 over 20 clients, T = 10, exact gradients and gradients
    + N(0, 100) noise. The marginal error is against Metropolis-adjusted HMC draws on the
    pooled data (cached). Reduced default: η ∈ {0.02, 0.05, 0.1}, 20 rounds, 8 chains, the
    samples of the last 10 rounds; ``--full``: η from 0.002, 200 rounds."""
    return _blr_eta("blr-eta", out_dir, quick, seed, full, 20 if quick else 1000, (0.0, 10.0))


def blr_d10(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """``blr-eta`` at d = 10 with stochastic gradients (the paper's Figure 1d)."""
    return _blr_eta("blr-d10", out_dir, quick, seed, full, 10, (10.0,))


def rounds_to_reach(curve: list[tuple[int, float]], eps: float) -> int | None:
    """The first round of ``curve`` ((round, value) pairs, rounds ascending) whose value
    is ≤ ``eps``; None if never."""
    for r, v in curve:
        if v <= eps:
            return r
    return None


def evaluation_rounds(rounds: int, every_until: int = 100, growth: float = 1.02) -> list[int]:
    """The rounds at which an online metric is computed: every round up to ``every_until``,
    then rounds growing by ``growth`` (so a long run costs O(log) evaluations, each within
    2 % of the round it stands for), and always the last."""
    out = list(range(1, min(rounds, every_until) + 1))
    r = float(every_until)
    while True:
        r *= growth
        nxt = max(out[-1] + 1, math.ceil(r))
        if nxt >= rounds:
            break
        out.append(nxt)
    if out[-1] != rounds:
        out.append(rounds)
    return out


def blr_t(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """Communication rounds to reach a target marginal error against T (the paper's
    Figure 1c): simulated BLR, 20 clients, K = 100, η = 0.01, gradients + N(0, 100) noise.

    For every T, S chains start at θ̄ = 0 and one global sample per chain is collected
    every round from round 1 on (no burn-in: reaching the posterior from the start is part
    of the communication cost). After each round (every round up to 100, then at rounds
    2 % apart: :func:`evaluation_rounds`) the ME of all samples collected so far
    (S · r of them, pooled over chains) against the MHMC reference is computed: the
    paper's "MEs in an online manner", with S chains in place of one so that a run needs S
    times fewer rounds. The rounds R_ε to reach ME ≤ ε are reported for ε a few percent
    above the lowest ME any T reached (the paper's ε = 0.1012, 0.105, 0.11 sit likewise
    just above its floor). Small T pays in rounds (little movement per round), large T in
    local-drift bias (its ME levels off above ε): the U-curve.

    Budgets (rounds per T: enough for a fixed number of local iterations, or a minimum
    number of rounds, whichever is more): quick d = 10, T ∈ {1, 10}, 4 chains, 20
    iterations; reduced (default) d = 10, T ∈ {1, 2, 5, 10, 20, 50, 100}, 16 chains, 200
    iterations or 5 rounds; full: the paper's d = 1000, T ∈ {1, 10, 20, …, 100}, 5,000
    iterations or 100 rounds (days on 2 cores).
    """
    from .metrics import wasserstein1_marginals
    from .problem import build_problem
    from .sampler import SamplerSettings, run_round

    budget = "quick" if quick else "full" if full else "reduced"
    dim, Ts, chains, iters, min_rounds = {
        "quick": (10, (1, 10), 4, 20, 2),
        "reduced": (10, (1, 2, 5, 10, 20, 50, 100), 16, 200, 5),
        "full": (1000, (1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100), 16, 5000, 100),
    }[budget]
    K, eta, noise = 100, 0.01, 10.0
    base = blr_config(dim, chains, seed, K, eta, grad_noise=noise)
    ref_sizes = {"quick": (4, 100, 100), "reduced": (8, 300, 500), "full": (16, 1000, 1000)}
    rc, rw, rs = ref_sizes[budget]
    from fedhmc_datasets.locate import cache_dir

    reference, ref_info = blr_reference(
        base, chains=rc, warmup=rw, samples=rs, cache=cache_dir() / "reference"
    )
    problem = build_problem(base)
    target = problem.target
    curves: dict[int, list[float]] = {}
    walls: dict[int, float] = {}
    from tqdm.auto import tqdm

    bar = tqdm(total=len(Ts), desc="T values", unit="T", disable=None, leave=False)
    for T in Ts:
        rounds = max(min_rounds, math.ceil(iters / T))
        settings = SamplerSettings(eta, K, T, rho=1.0, grad_noise=noise)
        theta = torch.zeros(chains, problem.dim, dtype=torch.float32)
        pooled = torch.empty(rounds * chains, problem.dim, dtype=torch.float32)
        at = set(evaluation_rounds(rounds))
        curve: list[tuple[int, float]] = []
        t0 = time.perf_counter()
        for r in range(1, rounds + 1):
            theta, _ = run_round(target, theta, seed, r, settings)
            if not torch.isfinite(theta).all():
                raise ConfigError(f"blr-T diverged at T = {T}, round {r}; lower the step size")
            pooled[(r - 1) * chains : r * chains] = theta
            if r in at:
                me = wasserstein1_marginals(pooled[: r * chains], reference).mean()
                curve.append((r, float(me)))
        walls[T] = time.perf_counter() - t0
        curves[T] = curve
        bar.update(1)
    bar.close()
    floor = min(v for c in curves.values() for _, v in c)
    epsilons = [round(floor * f, 4) for f in (1.02, 1.05, 1.1, 1.25)]
    rows = []
    for T in Ts:
        row = {"T": T, "rounds_run": curves[T][-1][0], "me_final": curves[T][-1][1]}
        row["me_min"] = min(v for _, v in curves[T])
        for i, eps in enumerate(epsilons):
            row[f"rounds_eps{i}"] = rounds_to_reach(curves[T], eps)
        row["wall_s"] = walls[T]
        rows.append(row)
    curve_rows = [{"T": T, "round": r, "me": v} for T in Ts for r, v in curves[T]]
    summary = {
        "experiment": "blr-T",
        "protocol": ALGORITHM3,
        "budget": budget,
        "dim": dim,
        "clients": 20,
        "K": K,
        "step_size": eta,
        "grad_noise": noise,
        "chains": chains,
        "epsilons": epsilons,
        "epsilon_rule": "1.02, 1.05, 1.1 and 1.25 × the lowest ME reached by any T",
        "reference": ref_info,
        "rows": rows,
    }
    _write(out_dir, "blr_T", rows, summary)
    _write(out_dir, "blr_T_curves", curve_rows, {"experiment": "blr-T", "curves": "me per round"})
    fig = _figure(10.0, 3.8)
    ax1, ax2 = fig.subplots(1, 2)
    for T in Ts:
        ax1.plot(*zip(*curves[T], strict=True), label=f"T = {T}")
    for eps in epsilons:
        ax1.axhline(eps, color="k", lw=0.5, ls=":")
    ax1.set_xscale("log")
    ax1.set_xlabel("communication rounds")
    ax1.set_ylabel("ME of the samples so far")
    ax1.legend(fontsize=7, ncol=2)
    for i, eps in enumerate(epsilons):
        pts = [(r["T"], r[f"rounds_eps{i}"]) for r in rows if r[f"rounds_eps{i}"] is not None]
        if pts:
            ax2.plot(*zip(*pts, strict=True), "o-", label=f"ε = {eps:.4g}")
    ax2.set_yscale("log")
    ax2.set_xlabel("local steps T")
    ax2.set_ylabel("rounds to reach ME ≤ ε")
    ax2.set_title(f"d = {dim}, K = {K}, η = {eta:g}, {chains} chains (missing: not reached)")
    ax2.title.set_fontsize(8)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "blr_T.png", dpi=120)
    return summary


# ------------------------------------------------------------------------- registry

EXPERIMENTS: dict[str, tuple[Callable, str]] = {
    "delayed-sgld": (
        delayed_sgld_experiment,
        "Kungurtsev et al. §3.2: shared-memory delayed SGLD (sync, w-con, w-icon), W₂ vs time",
    ),
    "debiased-gaussian": (
        debiased_gaussian,
        "bias of plain vs debiased FA-HMC on the heterogeneous Gaussian, T ∈ {10, 50, 200}",
    ),
    "gaussian-dim": (
        gaussian_dim,
        "heterogeneous Gaussian: rounds to reach W₂² < 0.1 against dimension (Figure 2)",
    ),
    "blr-eta": (blr_eta, "simulated BLR: ME of FA-HMC and FA-LD against η (Figure 1a, b)"),
    "blr-d10": (blr_d10, "simulated BLR, d = 10: ME against η (Figure 1d)"),
    "blr-T": (
        blr_t,
        "simulated BLR, K = 100, η = 0.01: rounds to an ME against T (Figure 1c)",
    ),
    "fmnist-K": (fmnist_k, "Fashion-MNIST logistic regression, K ∈ {1, 10, 50, 100} at T = 50"),
    "fmnist-T": (
        fmnist_t,
        "Fashion-MNIST logistic regression, T ∈ {1, 10, 20, 50, 100} at K = 10",
    ),
    "fmnist-mlp": (fmnist_mlp, "Fashion-MNIST two-hidden-layer MLP, K grid"),
    "kmnist": (kmnist, "KMNIST logistic regression, K grid (needs the KMNIST files)"),
    "cifar2": (cifar2, "CIFAR-2 logistic regression, K grid (needs the CIFAR-10 batches)"),
    "stale-gaussian": (
        stale_gaussian,
        "Chen et al. §5.1: MSE of stale SGHMC against staleness τ at L = L₀·τ",
    ),
    "stale-variance": (
        stale_variance,
        "Chen et al. §5.1: variance of the test loss against iterations per worker, W workers",
    ),
}


def _paper(name: str) -> Callable:
    def fn(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False, workers=1):
        from .paper import paper_figure

        return paper_figure(name, out_dir, quick=quick, full=full, seed=seed, workers=workers)

    fn.__name__ = name.replace("-", "_")
    return fn


def _paper_blr(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False):
    from .paper import paper_blr_t

    return paper_blr_t(out_dir, quick=quick, full=full, seed=seed)


_paper_blr.__doc__ = "Figure 1(c) under both protocols (see fedhmc.paper.paper_blr_t)."

EXPERIMENTS.update(
    {
        "paper-fmnist-K": (
            _paper("paper-fmnist-K"),
            "Figure 3 under the authors' protocol and Algorithm 3: K ∈ {1, 10, 50, 100}, "
            "T = 50 leapfrog steps, η tuned, 5 seeds (--full: 200 rounds)",
        ),
        "paper-fmnist-T": (
            _paper("paper-fmnist-T"),
            "Figure 4 under both protocols: T ∈ {1, 10, 20, 50, 100} at K = 10",
        ),
        "paper-fmnist-K-dirichlet": (
            _paper("paper-fmnist-K-dirichlet"),
            "Figure 3's grid on Dirichlet(0.1) clients, both protocols",
        ),
        "paper-fmnist-T-dirichlet": (
            _paper("paper-fmnist-T-dirichlet"),
            "Figure 4's grid on Dirichlet(0.1) clients, both protocols",
        ),
        "paper-blr-T": (
            _paper_blr,
            "Figure 1(c) under both protocols: rounds to reach an ME against T (both ways of "
            "counting the authors' rounds), and the odd/even-T bias question",
        ),
        "paper-fmnist-mlp": (
            _paper("paper-fmnist-mlp"),
            "the MLP at K ∈ {1, 10, 50}, T = 50, both protocols, one seed",
        ),
    }
)


def add_experiment_command(sub) -> None:
    p = sub.add_parser(
        "experiment",
        help="run one of the papers' experiments (tables and plots)",
        description="Run one of the papers' experiments; it writes a CSV table, a JSON "
        "summary and a PNG plot to --out.",
    )
    p.add_argument("name", nargs="?", choices=list(EXPERIMENTS), metavar="NAME")
    p.add_argument("--out", help="output directory (default runs/<time>-<name>)")
    p.add_argument("--quick", action="store_true", help="a small version, in seconds")
    p.add_argument(
        "--full",
        action="store_true",
        help="the paper's own budget (hours on 2 CPU cores for the data experiments)",
    )
    p.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="paper-* experiments: cells run in this many processes at once (default: 1)",
    )
    p.add_argument("--list", action="store_true", help="list the experiments")
    p.add_argument(
        "--data-dir", help="directory holding the dataset files (sets FEDHMC_DATA for the run)"
    )
    p.set_defaults(func=cmd_experiment)


def cmd_experiment(args: argparse.Namespace) -> int:
    if args.list or args.name is None:
        width = max(len(k) for k in EXPERIMENTS)
        for name, (_, text) in EXPERIMENTS.items():
            print(f"{name:<{width}}  {text}")
        return 0 if args.list else 2
    out = Path(args.out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{args.name}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out} is not writable ({e.strerror}); choose another") from None
    if args.data_dir:
        import os

        os.environ["FEDHMC_DATA"] = str(Path(args.data_dir).expanduser().resolve())
    fn, _ = EXPERIMENTS[args.name]
    kwargs = {"quick": args.quick, "seed": args.seed}
    if args.workers != 1:
        if "workers" not in inspect.signature(fn).parameters:
            raise ConfigError(f"{args.name} runs in one process; drop --workers")
        if args.workers < 1:
            raise ConfigError(f"--workers must be ≥ 1, got {args.workers}")
        kwargs["workers"] = args.workers
    if args.full:
        if args.quick:
            raise ConfigError("--quick and --full exclude each other; pick one")
        if "full" not in inspect.signature(fn).parameters:
            raise ConfigError(f"{args.name} has no --full budget; drop --full")
        kwargs["full"] = True
    summary = fn(out, **kwargs)
    rows = summary.get("rows", [])
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        print("  ".join(f"{k:>12}" for k in keys))
        for r in rows:
            print("  ".join(f"{_fmt(r.get(k, '')):>12}" for k in keys))
    print(f"files in {out}")
    return 0


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
