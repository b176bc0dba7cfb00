"""Where a run goes: the one place that sends a [`RunConfig`][fedhmc.runtime.config.RunConfig]
to its backend (``--backend engine`` or ``flower``).

The Flower backend lives in the Flower layer (``fedhmc_server``), above the runtime; it is
loaded here by name, when a run asks for it, so the runtime imports neither that layer nor
flwr otherwise.
"""

from __future__ import annotations

import importlib

BACKENDS = {
    "engine": ("fedhmc.runtime.engine", "run"),
    "flower": ("fedhmc_server.simulation", "run_flower"),
}
"""Backend name → (module, function); each function takes ``(cfg, progress=...)``."""


def run_config(cfg, progress: bool = True, threads: int | str | None = None):
    """Run ``cfg`` on its backend; returns the backend's
    [`RunResult`][fedhmc.runtime.engine.RunResult].

    ``threads`` (a number, ``"auto"`` or None) sets torch's intra-op threads: the engine
    chooses for ``"auto"`` from the size of a gradient evaluation; other backends take a
    number for the process they run in and leave ``"auto"`` to their workers.
    """
    module, name = BACKENDS[cfg.backend]
    fn = getattr(importlib.import_module(module), name)
    if cfg.backend == "engine":
        return fn(cfg, progress=progress, threads=threads)
    if isinstance(threads, int):
        from fedhmc.runtime.threads import apply_threads

        apply_threads(threads, 0)
    return fn(cfg, progress=progress)
