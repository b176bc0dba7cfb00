"""A sweep's grid: parse ``--grid`` strings and TOML sweep files, expand the cartesian product,
and name each cell (a readable prefix of its grid values and a short hash of all its settings).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re

from fedhmc.errors import ConfigError
from fedhmc.runtime.config import RECORDED_ONLY, RunConfig, step_size_symbol

_ABBREV = {
    "leapfrog-steps": "K",
    "local-steps": "T",
    "seed": "s",
    "num-clients": "N",
    "dim": "d",
    "algorithm": "",
}


def parse_grid(text: str) -> dict[str, list[str]]:
    """Parse ``"KEY=V1,V2 KEY2=V3"`` into ``{"KEY": ["V1", "V2"], "KEY2": ["V3"]}``.

    Keys are checked against [`RunConfig.keys`][fedhmc.runtime.config.RunConfig.keys] (snake-case is
    accepted and turned into kebab-case); values stay text and are parsed per cell by
    [`RunConfig.from_mapping`][fedhmc.runtime.config.RunConfig.from_mapping]. A value holding a
    comma (``hidden``) needs the TOML file.

    Raises
    ------
    ConfigError
        On a malformed item, a repeated or unknown key, or an empty value.
    """
    grid: dict[str, list[str]] = {}
    for item in text.split():
        key, sep, values = item.partition("=")
        vals = [v.strip() for v in values.split(",")]
        if not sep or not key.strip() or not values or any(v == "" for v in vals):
            raise ConfigError(
                f"malformed --grid item {item!r}: write KEY=V1,V2,... items separated by "
                'spaces, e.g. --grid "step-size=1e-3,3e-3 seed=0,1"'
            )
        key = _check_key(key.strip(), "--grid")
        if key in grid:
            raise ConfigError(f"--grid names {key!r} twice; give each key once")
        grid[key] = vals
    if not grid:
        raise ConfigError('--grid is empty; give e.g. --grid "step-size=1e-3,3e-3 seed=0,1"')
    return grid


def load_sweep_file(path: str | os.PathLike) -> tuple[dict[str, list], dict]:
    """Read a TOML sweep file: a ``[grid]`` table of lists and an optional ``[base]`` table.

    Returns ``(grid, base)``. A scalar in ``[grid]`` counts as a one-value list.
    """
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ConfigError("--file needs Python ≥ 3.11 (tomllib) or the tomli package") from None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read --file {str(path)!r} ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--file {str(path)!r} is not valid TOML: {e}") from None
    extra = sorted(set(data) - {"grid", "base"})
    if extra:
        raise ConfigError(
            f"--file {str(path)!r} has unknown table(s) {', '.join(extra)}; "
            "only [grid] and [base] are read"
        )
    raw_grid, raw_base = data.get("grid", {}), data.get("base", {})
    if not isinstance(raw_grid, dict) or not isinstance(raw_base, dict) or not raw_grid:
        raise ConfigError(
            f"--file {str(path)!r} needs a [grid] table of lists, e.g. "
            "[grid]\\nstep-size = [1e-3, 3e-3]\\nseed = [0, 1]"
        )
    grid: dict[str, list] = {}
    for key, values in raw_grid.items():
        values = values if isinstance(values, list) else [values]
        if not values:
            raise ConfigError(f"--file: grid key {key!r} has an empty list")
        grid[_check_key(key, "--file [grid]")] = values
    base = {_check_key(k, "--file [base]"): v for k, v in raw_base.items()}
    return grid, base


def _check_key(key: str, where: str) -> str:
    kebab = key.replace("_", "-")
    if kebab not in RunConfig.keys():
        raise ConfigError(f"{where}: unknown key {key!r}; valid: {', '.join(RunConfig.keys())}")
    if kebab == "out":
        raise ConfigError(f"{where}: 'out' cannot be set per cell; give the sweep's --out")
    return kebab


def expand_grid(grid: dict[str, list]) -> list[dict]:
    """The cartesian product of ``grid``, in key order (the last key varies fastest)."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


CELL_ID_DEFAULTS = {
    "local_steps": 10,
    "sync_unit": None,
    "fresh_gradients": None,
    "restart_trajectories": None,
    "leapfrog_steps": None,
    "step_size": None,
    "rho": 1.0,
    "anchor_batch_size": 0,
    "staleness": 0,
    "staleness_dist": "fixed",
    "friction": None,
    "max_staleness": 10,
    "grad_noise": 0.0,
    "temperature": None,
}
"""What a cell's id hashes for these samplers' options where the cell does not give them:
fixed values, so that a cell keeps its id (and a sweep finds its finished cells) whatever
the samplers' own defaults."""


def cell_id(settings: dict, cell: dict) -> str:
    """A stable directory name: the cell's grid values, then a hash of all its settings.

    ``settings`` is the merged base and cell mapping; the hash is taken over the parsed
    config (so ``0.01`` and ``"1e-2"`` give the same cell) without ``out`` and ``compile``
    (hashed as unset: how a cell computes, `RUN_ONLY_KEYS`; unset, so that the cells of a
    sweep that gave none keep their ids).
    """
    cfg = RunConfig.from_mapping({k: v for k, v in settings.items() if k != "out"})
    hashed = {**CELL_ID_DEFAULTS, **cfg.to_dict(), "out": None, "compile": None}
    canon = json.dumps(hashed, sort_keys=True, default=str)
    digest = hashlib.sha1(canon.encode()).hexdigest()[:8]
    parts = []
    for key in cell:
        typed = getattr(cfg, key.replace("-", "_"))
        text = f"{typed:g}" if isinstance(typed, float) else str(typed)
        abbrev = step_size_symbol(cfg.algorithm) if key == "step-size" else _ABBREV.get(key, key)
        parts.append(abbrev + text)
    prefix = re.sub(r"[^A-Za-z0-9.+=-]+", "-", "_".join(parts).replace("_", "~"))
    prefix = prefix.replace("~", "_")[:48].strip("-_")
    return f"{prefix}-{digest}" if prefix else digest


RUN_ONLY_KEYS = (
    "out",
    "resume",
    "overwrite",
    "checkpoint_every",
    "device",
    "client_gpus",
    "cuda_graphs",
    "compile",
    *RECORDED_ONLY,
)
"""Settings that say how a run is carried out, not what it computes (and what
``config.json`` records beside the settings). The device is one: the chain's random
numbers are the same on every device, so a cell finished on a GPU is not rerun on a CPU.
``--compile`` is another (it changes only the float rounding), and a cell's id does not
hash it either."""
