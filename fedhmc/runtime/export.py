"""Export a run's draws to ArviZ: ``fedhmc export RUN_DIR --to arviz``.

The run must have kept its draws (``--save-samples``: ``samples.npy``, shaped
(draws, chains, d)). The export is an ``arviz.InferenceData`` written as netCDF:

- ``posterior``: the global samples θ̄ with dims (chain, draw, …), split into the model's
  parameters: for logistic regression ``weight`` (class, feature) and ``bias`` (class);
  for the MLP ``layer{i}_weight`` (out, in) and ``layer{i}_bias`` (out), with the unit
  dims named ``input``, ``hidden1``, … , ``class``; for Gaussian targets ``theta``
  (parameter).
- ``sample_stats``: for each draw, the metrics of the round it was collected in
  (``round``, ``accuracy``, ``brier``, ``ece``, ``nll_mean``, ``nll_sum``, or ``w2`` and
  ``mean_error``; ``energy_error``, ``grad_evals``, ``wall_s``). These describe the model
  average over all chains so far, so every chain carries the same values.
- attributes of the InferenceData (``idata.attrs``): the run's resolved configuration
  (``fedhmc_config``, JSON, and each scalar option as ``fedhmc_<name>``), its status and
  the fedhmc version.

ArviZ (with xarray and a netCDF backend) is the optional extra ``fedhmc[arviz]``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import numpy as np

from fedhmc.errors import ConfigError, loads_json

STAT_COLUMNS = (
    "round",
    "accuracy",
    "brier",
    "ece",
    "nll_mean",
    "nll_sum",
    "w2",
    "mean_error",
    "energy_error",
    "grad_evals",
    "wall_s",
)


def _need_arviz():
    try:
        import arviz as az
    except ImportError:
        raise ConfigError(
            "the ArviZ export needs ArviZ: pip install 'fedhmc[arviz]' "
            "(arviz, xarray and the h5netcdf backend)"
        ) from None
    return az


def param_layout(config: dict, summary: dict, dim: int) -> list[tuple[str, tuple, np.ndarray]]:
    """[(name, dims, index array into θ)] for the run's model; one flat ``theta`` when the
    model's shapes are unknown (Gaussian targets, or a run without them in its summary)."""
    shapes = summary.get("model_shapes") or {}
    model = config.get("model")
    layout = summary.get("model_parameters")
    if layout:  # a module: its own parameter names and shapes, such as conv1.weight
        out, i = [], 0
        for name, shape in layout:
            n = int(np.prod(shape)) if shape else 1
            dims = tuple(f"{name}_dim{k}" for k in range(len(shape)))
            out.append((name, dims, np.arange(i, i + n).reshape(shape)))
            i += n
        if i == dim:
            return out
    if summary.get("model") is None and not shapes:
        return [("theta", ("parameter",), np.arange(dim))]
    F, C = shapes.get("num_features"), shapes.get("num_classes")
    if F is None or C is None:
        return [("theta", ("parameter",), np.arange(dim))]
    if model == "logistic" and (F + 1) * C == dim:
        idx = np.arange(dim).reshape(F + 1, C)
        return [("weight", ("class", "feature"), idx[:F].T), ("bias", ("class",), idx[F])]
    if model == "mlp":
        hidden = [int(h) for h in str(config.get("hidden", "")).split(",") if h.strip()]
        widths = [F, *hidden, C]
        names = ["input", *(f"hidden{i + 1}" for i in range(len(hidden))), "class"]
        out, i = [], 0
        for layer in range(len(widths) - 1):
            n_in, n_out = widths[layer], widths[layer + 1]
            w = np.arange(i, i + n_out * n_in).reshape(n_out, n_in)
            i += n_out * n_in
            b = np.arange(i, i + n_out)
            i += n_out
            out.append((f"layer{layer}_weight", (names[layer + 1], names[layer]), w))
            out.append((f"layer{layer}_bias", (names[layer + 1],), b))
        if i == dim:
            return out
    return [("theta", ("parameter",), np.arange(dim))]


def load_samples(run: str | Path) -> np.ndarray:
    """``RUN/samples.npy``, the draws (draws, chains, d), or a one-line ``ConfigError``
    when the file is damaged (cut short by a full disk or a copy, or not an array)."""
    path = Path(run) / "samples.npy"
    try:
        draws = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError) as e:
        detail = " ".join(str(e).split())[:160] or type(e).__name__
        raise ConfigError(
            f"{path} is damaged ({detail}); it is written whole at the end of a run: "
            f"restore it, or run again with --save-samples"
        ) from None
    if not isinstance(draws, np.ndarray) or draws.ndim != 3:
        shape = getattr(draws, "shape", "?")
        raise ConfigError(
            f"{path} has shape {shape}, not the (draws, chains, d) that --save-samples "
            "writes; restore it, or run again with --save-samples"
        )
    if not np.issubdtype(draws.dtype, np.floating):
        raise ConfigError(
            f"{path} holds {draws.dtype} values, not the floats that --save-samples writes; "
            "restore it, or run again with --save-samples"
        )
    _check_width(path, draws)
    return draws


def _check_width(path: Path, draws: np.ndarray) -> None:
    """A one-line ``ConfigError`` when the draws are not of the run's parameters and
    chains (as its summary.json and config.json say, where they are readable)."""

    def recorded(name: str, key: str):
        try:
            value = loads_json((path.parent / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    for axis, name, key, what in ((2, "summary.json", "dim", "parameters"),
                                  (1, "config.json", "chains", "chains")):  # fmt: skip
        want = recorded(name, key)
        if want is not None and draws.shape[axis] != want:
            raise ConfigError(
                f"{path} holds draws of {draws.shape[axis]} {what}, the run has {want} (its "
                f"{name}): it is not this run's; restore it, or run again with --save-samples"
            )


def _read_json(path: Path) -> dict:
    """A run's JSON file as a dict, or a one-line ``ConfigError``."""
    try:
        value = loads_json(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path} ({e}); restore it from the run") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} holds a JSON {type(value).__name__}, not the run's object")
    return value


def _collected_rows(run: Path) -> list[dict]:
    """The metrics.csv rows of the rounds whose θ̄ was collected (``samples`` went up)."""
    rows, prev = [], 0
    try:
        with open(run / "metrics.csv", newline="") as f:
            for r in csv.DictReader(f):
                try:
                    n = int(r["samples"])
                except (KeyError, TypeError, ValueError):
                    continue
                if n > prev:
                    rows.append(r)
                prev = n
    except (OSError, UnicodeDecodeError, csv.Error):
        return []  # no per-draw statistics: the draws themselves still export
    return rows


def _attr(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    return None


def to_inference_data(run_dir: str | Path):
    """The run in ``run_dir`` as an ``arviz.InferenceData``."""
    az = _need_arviz()
    run = Path(run_dir)
    if not (run / "config.json").is_file():
        raise ConfigError(f"{run} has no config.json; is it a fedhmc run directory?")
    if not (run / "samples.npy").is_file():
        raise ConfigError(
            f"{run} has no samples.npy: the draws were not kept; run with --save-samples"
        )
    config = _read_json(run / "config.json")
    summary_path = run / "summary.json"
    summary = _read_json(summary_path) if summary_path.is_file() else {}
    draws = load_samples(run)  # (draws, chains, d)
    # (chain, draw, d), in float64: ArviZ then folds and ranks at the precision fedhmc's
    # own diagnostics use (in float32, rounding creates ties that move R̂ by ~1e-3).
    x = np.ascontiguousarray(draws.transpose(1, 0, 2), dtype=np.float64)
    posterior, dims = {}, {}
    for name, names, idx in param_layout(config, summary, x.shape[-1]):
        posterior[name] = x[..., idx]
        dims[name] = list(names)
    rows = _collected_rows(run)[: x.shape[1]]
    stats = {}
    for col in STAT_COLUMNS:
        vals = [r.get(col, "") for r in rows]
        if len(vals) == x.shape[1] and all(v not in ("", None) for v in vals):
            arr = np.array([float(v) for v in vals])
            if col in ("round", "grad_evals"):
                arr = arr.astype(np.int64)
            stats[col] = np.broadcast_to(arr, (x.shape[0], x.shape[1])).copy()
    from fedhmc import __version__

    attrs = {
        "fedhmc_version": __version__,
        "fedhmc_config": json.dumps(config, default=str),
        "fedhmc_status": str(summary.get("status", "unknown")),
    }
    for k, v in config.items():
        a = _attr(v)
        if a is not None:
            attrs[f"fedhmc_{k}"] = a
    if config.get("model_frozen"):  # the module's parameters that kept their values
        attrs["fedhmc_model_frozen"] = json.dumps(config["model_frozen"])
    return az.from_dict(
        posterior=posterior,
        sample_stats=stats or None,
        dims=dims,
        attrs=attrs,
    )


def export_arviz(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``to_inference_data(run_dir)`` as netCDF (default ``RUN_DIR/posterior.nc``),
    atomically; returns the path."""
    from fedhmc.runtime.output import PRIVATE_MODE, check_out_file, open_private, refuse_links

    if out is not None:
        check_out_file(out, example="posterior.nc")
    idata = to_inference_data(run_dir)
    path = Path(out) if out is not None else Path(run_dir) / "posterior.nc"
    if out is None:  # inside the run folder: a link planted there is refused
        refuse_links(path.parent, (path.name,))
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a link planted there is removed, never written through
    open_private(tmp).close()  # the draws may reveal the data: 0600 from the start
    try:
        idata.to_netcdf(str(tmp), engine="h5netcdf")
        os.chmod(tmp, PRIVATE_MODE)
        tmp.replace(path)
    except (ValueError, ImportError) as e:
        tmp.unlink(missing_ok=True)
        raise ConfigError(
            f"could not write {path} ({e}); pip install 'fedhmc[arviz]' for the h5netcdf backend"
        ) from None
    except OSError as e:  # a full disk, a folder where the file would go: nothing left behind
        tmp.unlink(missing_ok=True)
        raise ConfigError(
            f"could not write {path} ({e.strerror or e}); nothing was written"
        ) from None
    return path
