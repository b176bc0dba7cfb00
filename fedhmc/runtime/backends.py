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
