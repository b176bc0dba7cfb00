"""``stale-variance``: variance of the test loss against iterations per worker, W workers
(Chen et al. §5.1).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from fedhmc.core.progress import track
from fedhmc.experiments._common import _write, write_csv
from fedhmc.viz.plots import new_figure


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
    from fedhmc.algorithms import stale

    workers = (1, 2, 4) if quick else (1, 2, 4, 8, 16)
    per_worker = 100 if quick else 1000
    burn = 200 if quick else 2000
    chains = 20 if quick else 100
    h = 2e-5
    target, test_loss = _breast_cancer_blr(chains, seed)
    warm = stale.Settings("sgld", h, local_steps=burn)
    start, _ = stale.step(seed, stale.init(torch.zeros(chains, target.dim), warm), target, warm)
    rows, curves = [], {}
    for W in track(workers, "workers", "W"):
        row, curves[W] = _stale_variance_run(
            W, (start, warm.local_steps), target, test_loss, (per_worker, chains, h), seed
        )
        rows.append(row)
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
    curve_rows = [
        {"workers": W, "iterations_per_worker": x, "variance": y}
        for W, (xs, ys) in curves.items()
        for x, y in zip(xs, ys, strict=True)
    ]
    write_csv(out_dir / "stale_variance_curves.csv", curve_rows)
    _plot(out_dir / "stale_variance.png", curves)
    return summary


def _breast_cancer_blr(chains: int, seed: int):
    """The pooled breast-cancer BLR (minibatch 32, prior N(0, 0.1² I)) and its test
    function: the mean test-set logistic loss of each chain's sample, (S, D) → (S,)."""
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.problem import build_problem

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

    def test_loss(theta: torch.Tensor) -> torch.Tensor:
        lp = model.log_probs(theta, X_test.to(theta.dtype))  # (S, M, C)
        return -lp.gather(-1, y_test.view(1, -1, 1).expand(theta.shape[0], -1, 1)).mean((1, 2))

    return target, test_loss


def _stale_variance_run(W: int, warm: tuple, target, test_loss, budget: tuple, seed: int):
    """W workers as one chain with staleness W − 1, continued from ``warm`` = (the state
    after burn-in, its Euler steps per round) for W · L̄ steps (``budget`` = (L̄, chains,
    h)); the table row and the variance curve (iterations per worker, variance)."""
    from fedhmc.algorithms import stale

    (start, warm_steps), (per_worker, chains, h) = warm, budget
    settings = stale.Settings("sgld", h, staleness=W - 1, local_steps=1)
    # Continue at Euler step l = burn: one step a round, so as at round burn.
    state = dataclasses.replace(
        stale.init(start.position, settings), round=start.round * warm_steps
    )
    total = torch.zeros(chains, dtype=torch.float64)
    xs, ys = [], []
    t0 = time.perf_counter()
    for step in range(1, W * per_worker + 1):
        state, _ = stale.step(seed, state, target, settings)
        total += test_loss(state.position).to(torch.float64)
        if step % W == 0 and (step // W) % max(1, per_worker // 20) == 0:
            xs.append(step // W)
            ys.append(float((total / step).var()))
    row = {
        "workers": W,
        "staleness": W - 1,
        "iterations_per_worker": per_worker,
        "variance": ys[-1],
        "wall_s": time.perf_counter() - t0,
    }
    return row, (xs, ys)


def _plot(path: Path, curves: dict) -> None:
    """The figure from the variance curves (W → (iterations per worker, variance) lists,
    from ``stale_variance_curves.csv``)."""
    fig = new_figure(6.0, 4.0)
    ax = fig.add_subplot()
    for W, (xs, ys) in curves.items():
        ax.loglog(xs, ys, label=f"W = {W}")
    ax.set_xlabel("iterations per worker L̄")
    ax.set_ylabel("variance of the sample-average test loss")
    ax.set_title("Stale SGLD, breast-cancer BLR: variance against L̄", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
