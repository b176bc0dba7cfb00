"""What every backend starts a run with: `prepare`, which resolves a
[`RunConfig`][fedhmc.runtime.config.RunConfig] (its defaults filled in) and fixes its output
folder. The engine (`fedhmc.runtime.engine`) and the Flower server (``fedhmc_server``) both
import it from here; `fedhmc.runner` sends a config to its backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedhmc.runtime.config import ResolvedConfig, RunConfig


def prepare(cfg: RunConfig) -> ResolvedConfig:
    """``cfg`` resolved (its defaults filled in; a
    [`ResolvedConfig`][fedhmc.runtime.config.ResolvedConfig] is not resolved again), with
    its output directory fixed."""
    cfg = cfg.resolve()
    return cfg if cfg.out else cfg.with_out(cfg.default_out())
