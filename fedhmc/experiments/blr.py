"""Simulated Bayesian logistic regression presets: ``blr-eta``, ``blr-d10`` and ``blr-T``
(the paper's Figure 1), with the reference posterior they measure against.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from fedhmc.errors import ConfigError
from fedhmc.experiments._common import ALGORITHM3, _write
from fedhmc.viz.plots import new_figure


def blr_config(dim: int, chains: int, seed: int, K: int, eta: float, **extra):
    """The simulated-BLR setting of the paper's Figure 1: 20 iid clients, full-batch
    gradients, K leapfrog steps of size η (resolved)."""
    from fedhmc.runtime.config import RunConfig

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

    from fedhmc.algorithms.mhmc import mhmc, pooled_energy
    from fedhmc.runtime.problem import build_problem

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

    from fedhmc.analysis.metrics import marginal_error
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.engine import run

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
    fig = new_figure(4.5 * len(noises), 3.6)
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
    from fedhmc.algorithms.fahmc import SamplerSettings, run_round
    from fedhmc.analysis.metrics import wasserstein1_marginals
    from fedhmc.runtime.problem import build_problem

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
    fig = new_figure(10.0, 3.8)
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
