"""What the simulated Bayesian logistic regression presets share: the run configuration and
the reference posterior (reference HMC, cached) they measure against.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


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
