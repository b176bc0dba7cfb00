"""The in-process, batched FA-HMC engine: ``fedhmc run``'s default backend.

All clients and chains advance together (see :mod:`fedhmc.sampler`); after every round the
global sample θ̄ is evaluated, collected every ``thin`` rounds after ``burn_in``, and the
round's metrics are appended to ``metrics.csv``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .config import RunConfig
from .errors import NonFiniteError
from .output import RunWriter
from .problem import Problem, build_problem, bytes_per_round, initial_position
from .sampler import SamplerSettings, run_round


def sampler_settings(cfg: RunConfig) -> SamplerSettings:
    """The sampler's settings from a resolved config."""
    return SamplerSettings(
        step_size=float(cfg.step_size),
        leapfrog_steps=int(cfg.leapfrog_steps),
        local_steps=int(cfg.local_steps),
        rho=float(cfg.rho),
        grad_noise=float(cfg.grad_noise),
        temperature=float(cfg.temperature),
    )


def is_collect_round(cfg: RunConfig, round_: int) -> bool:
    """Whether round ``round_`` (1-based) contributes a sample."""
    return round_ > cfg.burn_in and (round_ - cfg.burn_in) % cfg.thin == 0


def finite_or_none(metrics: dict) -> dict:
    """JSON-safe metrics: non-finite floats become None."""
    out = {}
    for k, v in metrics.items():
        out[k] = v if not isinstance(v, float) or math.isfinite(v) else None
    return out


@dataclass
class RunResult:
    """What a run returns in Python (the files hold the same)."""

    config: RunConfig
    theta_bar: torch.Tensor
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    @property
    def final(self) -> dict:
        return self.history[-1] if self.history else {}


def run(
    cfg: RunConfig,
    problem: Problem | None = None,
    progress: bool = True,
    on_round: Callable[[dict], None] | None = None,
) -> RunResult:
    """Run FA-HMC in process and write the run's files.

    Parameters
    ----------
    cfg
        The run's settings; resolved here if not yet.
    problem
        A prebuilt problem (defaults to :func:`fedhmc.problem.build_problem`).
    progress
        Show a progress bar over rounds (on a terminal).
    on_round
        Called with each round's metrics row.

    Raises
    ------
    NonFiniteError
        When θ̄ or an energy becomes non-finite; the files written so far stay valid.
    """
    cfg = cfg.resolve()
    out = cfg.out or cfg.default_out()
    cfg = cfg.replace(out=out)
    device = torch.device(cfg.device)
    if problem is None:
        problem = build_problem(cfg, device=device)
    writer = RunWriter(out, problem.evaluator.columns)
    writer.write_config(cfg.to_dict())
    settings = sampler_settings(cfg)
    theta_bar = initial_position(problem, cfg, device=device)
    down, up = bytes_per_round(cfg, problem.dim)
    result = RunResult(cfg, theta_bar)
    grad_evals, t0 = 0, time.perf_counter()
    status = "running"
    bar = _progress(cfg.rounds, progress)
    try:
        for r in range(1, cfg.rounds + 1):
            theta_bar, info = run_round(problem.target, theta_bar, cfg.seed, r, settings)
            grad_evals += info.grad_evals
            if not (torch.isfinite(theta_bar).all() and torch.isfinite(info.energy).all()):
                status = "diverged"
                raise NonFiniteError(
                    f"round {r}: the chain diverged (non-finite position or energy); "
                    f"try a smaller --step-size than {cfg.step_size:g}, "
                    f"e.g. {cfg.step_size / 2:g}"
                )
            collect = is_collect_round(cfg, r)
            metrics = problem.evaluator(theta_bar, collect)
            if collect and cfg.save_samples:
                writer.add_sample(theta_bar)
            row = {
                "round": r,
                **metrics,
                "wall_s": time.perf_counter() - t0,
                "grad_evals": grad_evals,
            }
            writer.write_row(row)
            result.history.append(row)
            result.theta_bar = theta_bar
            if on_round is not None:
                on_round(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(_postfix(metrics), refresh=False)
        status = "completed"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if bar is not None:
            bar.close()
        rounds_done = len(result.history)
        result.summary = {
            "status": status,
            "rounds_completed": rounds_done,
            "final": finite_or_none(
                {k: v for k, v in result.final.items() if k not in ("wall_s", "grad_evals")}
            ),
            "wall_s": time.perf_counter() - t0,
            "grad_evals": grad_evals,
            "grad_evals_per_s": grad_evals / max(time.perf_counter() - t0, 1e-9),
            "bytes_down": down * rounds_done,
            "bytes_up": up * rounds_done,
            "bytes_total": (down + up) * rounds_done,
            "bytes_per_round": down + up,
            "dim": problem.dim,
            "num_clients": problem.target.num_clients,
            "data": problem.description,
            "backend": "engine",
        }
        writer.write_samples()
        writer.write_summary(result.summary)
        writer.close()
    return result


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="rounds", unit="round", disable=None, leave=False)


def _postfix(metrics: dict) -> dict:
    keys = ("accuracy", "nll_mean") if "accuracy" in metrics else ("w2", "mean_error")
    return {k: f"{metrics[k]:.4g}" for k in keys if k in metrics}
