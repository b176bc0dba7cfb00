"""The in-process engine: [`run`][fedhmc.runtime.engine.run] runs a config on
[`EngineBackend`][fedhmc.runtime.engine.EngineBackend], which advances all clients and chains
in one batched computation (each round is the algorithm's ``step``). The loop between rounds,
the run's files and checkpoints are the shared round loop's
([`run_loop`][fedhmc.runtime.loop.run_loop]), which the Flower backend drives too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedhmc.algorithms import registry
from fedhmc.errors import ConfigError
from fedhmc.runtime import checkpoint
from fedhmc.runtime.backends import prepare
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.loop import RoundStats, RunResult, run_loop, setup_rounds_of
from fedhmc.runtime.problem import (
    Problem,
    bits_up_per_round,
    build_problem,
    bytes_per_round,
    initial_position,
)
from fedhmc.runtime.threads import apply_threads, round_work, threads_restored


class EngineBackend:
    """The in-process engine as a [`Backend`][fedhmc.runtime.loop.Backend]: each round is
    the algorithm's ``step``, every client and chain batched; θ̄ is its state's position."""

    name = "engine"

    def __init__(self, cfg: RunConfig, problem: Problem, device: torch.device):
        self.cfg, self.target, self.dim = cfg, problem.target, problem.dim
        self.device = device
        self.compiled = getattr(problem.model, "compiled", None)  # a module's gradient
        self.module, self.settings = registry.algorithm_of(cfg)
        theta0 = initial_position(problem.model, problem.dim, cfg, device=device)
        self.state = self.module.init(theta0, self.settings)
        self.setup_rounds = setup_rounds_of(self.module, self.settings)

    @property
    def position(self) -> torch.Tensor:
        return self.state.position

    def round(self, r: int) -> RoundStats:
        self.state, info = self.module.step(self.cfg.seed, self.state, self.target, self.settings)
        down, up = bytes_per_round(self.cfg, self.dim, r, info.clients)  # the drawn clients
        return RoundStats(
            grad_evals=info.grad_evals,
            finite=info.finite,
            clients=info.clients,
            bytes_down=down,
            bytes_up=up,
            energy_error=info.energy_error,
            bits_up=bits_up_per_round(self.cfg, self.dim, r, info.clients, self.settings),
        )

    def state_dict(self) -> dict:
        return checkpoint.state_dict(self.state)

    def load_state_dict(self, saved: dict) -> None:
        cls = type(self.state)
        self.state = checkpoint.state_from_dict(saved, cls, self.device)

    def summary(self) -> dict:
        """Whether a module's gradient ran compiled (``--compile``; None: no module); with
        CUDA graphs, how many rounds this process replayed from them, and why they were
        turned off if they were."""
        out = {} if self.compiled is None else {"model_compiled": self.compiled}
        graphs = getattr(self.target, "graphs", None)
        if graphs is not None:
            out["cuda_graph_replays"] = graphs.replays
            if graphs.off is not None:
                out["cuda_graphs_off"] = graphs.off
        return out


def run(
    cfg: RunConfig,
    problem: Problem | None = None,
    progress: bool = True,
    on_round: Callable[[dict], None] | None = None,
    threads: int | str | None = None,
) -> RunResult:
    """Run ``cfg`` on the in-process engine (all clients and chains batched) and write the
    run's files. A ``--backend flower`` config is refused: run it with ``fedhmc.run``
    (`fedhmc.runner.run_config`), which sends every config to its backend.

    Parameters
    ----------
    cfg
        The run's settings; resolved here if not yet.
    problem
        A prebuilt problem (defaults to `fedhmc.runtime.problem.build_problem`).
    progress
        Show a progress bar over rounds (on a terminal).
    on_round
        Called with each round's metrics row.
    threads
        torch's intra-op threads for the run: a number, or ``"auto"`` (one thread for small
        gradient evaluations, every core for large ones: `fedhmc.runtime.threads`). None
        (the default) chooses as ``fedhmc run`` does: ``auto``, unless the command line's
        ``--threads`` set another for its process. The caller's thread count is restored
        when the run returns.
    """
    cfg = _engine_config(cfg)
    device = torch.device(cfg.device)
    if problem is None:
        problem = build_problem(cfg, device=device)
    with threads_restored():  # the run's threads for the run only
        apply_threads(threads, round_work(problem.target, cfg))
        return run_loop(
            cfg,
            problem.evaluator,
            EngineBackend(cfg, problem, device),
            dim=problem.dim,
            num_clients=problem.target.num_clients,
            description=problem.description,
            progress=progress,
            on_round=on_round,
        )


def _engine_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` prepared for the engine, or a one-line refusal of what it cannot run."""
    if cfg.backend != "engine":
        raise ConfigError(
            f"fedhmc.runtime.engine.run runs --backend engine; run a --backend {cfg.backend} "
            "config with fedhmc.run"
        )
    cfg = prepare(cfg)
    if cfg.on_failure != "renormalize":  # (the Flower server reads it; this engine does not)
        raise ConfigError(
            f"--on-failure {cfg.on_failure} applies to --backend flower (the engine's clients "
            "cannot fail); drop --on-failure or add --backend flower"
        )
    if "engine" not in registry.entry(cfg.algorithm).backends:
        raise ConfigError(
            f"--algorithm {cfg.algorithm} is a message exchange between a server and Flower "
            "workers; add --backend flower (or use --algorithm sghmc/sgld in process)"
        )
    return cfg
