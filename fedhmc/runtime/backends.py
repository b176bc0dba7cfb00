"""What every backend starts a run with: `prepare`, which resolves a
[`RunConfig`][fedhmc.runtime.config.RunConfig] (its defaults filled in) and fixes its output
folder. The engine (`fedhmc.runtime.engine`) and the Flower server (``fedhmc_server``) both
import it from here; `fedhmc.runner` sends a config to its backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedhmc.runtime.config import RunConfig


def prepare(cfg: RunConfig) -> RunConfig:
    """``cfg`` resolved (its defaults filled in), with its output directory fixed."""
    cfg = cfg.resolve()
    return cfg.replace(out=cfg.out or cfg.default_out())
