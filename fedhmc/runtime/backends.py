"""Where a run goes: the one place that sends a :class:`~fedhmc.runtime.config.RunConfig`
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


def run_config(cfg, progress: bool = True):
    """Run ``cfg`` on its backend; returns the backend's :class:`RunResult`."""
    module, name = BACKENDS[cfg.backend]
    return getattr(importlib.import_module(module), name)(cfg, progress=progress)
