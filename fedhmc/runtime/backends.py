"""Where a run goes: the one place that sends a [`RunConfig`][fedhmc.runtime.config.RunConfig]
to its backend (``--backend engine`` or ``flower``), and `prepare`, which every backend
starts with.

The backends are loaded here by name, when a run asks for one: the Flower backend lives in
the Flower layer (``fedhmc_server``), above the runtime, so the runtime imports neither that
layer nor flwr otherwise; and this module imports no backend, so that each of them can
import `prepare` from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedhmc.runtime.config import RunConfig

RUNNERS = {
    "engine": ("fedhmc.runtime.engine", "run"),
    "flower": ("fedhmc_server.simulation", "run_flower"),
}
"""Backend name → (module, function); each function takes ``(cfg, progress=...)``."""


def prepare(cfg: RunConfig) -> RunConfig:
    """``cfg`` resolved (its defaults filled in), with its output directory fixed. A resumed
    run keeps the ``--compile`` its folder recorded, unless ``cfg`` sets it."""
    if cfg.resume and cfg.compile is None and cfg.out:
        cfg = cfg.replace(compile=saved_compile(cfg.out))
    cfg = cfg.resolve()
    return cfg.replace(out=cfg.out or cfg.default_out())


def saved_compile(out) -> bool | None:
    """The ``--compile`` that the run in folder ``out`` recorded in its config.json: False for
    a run recorded before the option existed (its gradients were not compiled), None where
    it played no part or nothing is readable (the default rule decides)."""
    from pathlib import Path

    from fedhmc.errors import loads_json

    try:
        saved = loads_json((Path(out) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict):
        return None
    from fedhmc.runtime.config import with_settings_added

    value = with_settings_added(saved)["compile"]
    return value if isinstance(value, bool) else None


def run_config(
    cfg: RunConfig,
    problem=None,
    progress: bool = True,
    on_round=None,
    threads: int | str | None = None,
):
    """Run ``cfg`` on its backend (``fedhmc.run``); returns the backend's
    [`RunResult`][fedhmc.runtime.engine.RunResult].

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
    module, name = RUNNERS[cfg.backend]
    fn = getattr(importlib.import_module(module), name)
    if cfg.backend == "engine":
        return fn(cfg, problem, progress=progress, on_round=on_round, threads=threads)
    if problem is not None:
        from fedhmc.errors import ConfigError

        raise ConfigError(
            f"a prebuilt problem runs on the engine only; drop it for --backend {cfg.backend}"
        )
    if isinstance(threads, int):
        from fedhmc.runtime.threads import apply_threads

        apply_threads(threads, 0)
    return fn(cfg, progress=progress, on_round=on_round)
