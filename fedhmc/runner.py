"""Where a run goes: [`run_config`][fedhmc.runner.run_config] (``fedhmc.run``) sends a
[`RunConfig`][fedhmc.runtime.config.RunConfig] to its backend, ``--backend engine``
([`run`][fedhmc.runtime.engine.run]) or ``flower`` (``fedhmc_server.simulation.run_flower``).
``fedhmc run``, sweeps and experiments start their runs here too.

This module is a layer of its own, above both backends: the runtime below it imports neither
this module nor the Flower layer. The Flower backend is imported when a run asks for it, so
that a run on the engine does not load flwr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.loop import RunResult


def run_config(
    cfg: RunConfig,
    problem=None,
    progress: bool = True,
    on_round=None,
    threads: int | str | None = None,
) -> RunResult:
    """Run ``cfg`` on its backend (``fedhmc.run``); returns the backend's
    [`RunResult`][fedhmc.runtime.loop.RunResult].

    ``threads`` (a number, ``"auto"`` or None) sets torch's intra-op threads: the engine
    chooses for ``"auto"`` from the size of a gradient evaluation; other backends take a
    number for the process they run in and leave ``"auto"`` to their workers.
    ``on_round`` is called with each round's metrics row; ``problem``, a prebuilt problem,
    is the engine's only (`fedhmc.runtime.engine.run`). torch's thread count is the
    caller's again when the run returns (or raises).
    """
    from fedhmc.runtime.threads import threads_restored

    with threads_restored():  # the caller's process keeps its own thread count
        return _run_backend(cfg, problem, progress, on_round, threads)


def _run_backend(cfg: RunConfig, problem, progress: bool, on_round, threads):
    if cfg.backend == "engine":
        from fedhmc.runtime.engine import run

        return run(cfg, problem, progress=progress, on_round=on_round, threads=threads)
    from fedhmc_server.simulation import run_flower  # --backend flower (BACKENDS' other)

    if problem is not None:
        from fedhmc.errors import ConfigError

        raise ConfigError(
            f"a prebuilt problem runs on the engine only; drop it for --backend {cfg.backend}"
        )
    if isinstance(threads, int):
        from fedhmc.runtime.threads import apply_threads

        apply_threads(threads, 0)
    return run_flower(cfg, progress=progress, on_round=on_round)
