"""``fedhmc diagnose RUN_DIR``: R̂, bulk and tail ESS of the worst parameters of a run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedhmc.errors import ConfigError, loads_json


def add_diagnose_command(sub) -> None:
    p = sub.add_parser(
        "diagnose",
        help="convergence diagnostics of a run's draws, worst parameters first",
        description="Split R-hat, bulk ESS and tail ESS (rank-normalised, as Stan and ArviZ "
        "compute them) of every parameter of a run with two chains or more; prints the worst.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (fedhmc run --out)")
    p.add_argument("--top", type=int, default=10, help="how many parameters to show (default 10)")
    p.set_defaults(func=cmd_diagnose)


def load_draws(run: Path) -> np.ndarray:
    """The run's collected θ̄, (draws, chains, D): samples.npy, else the checkpoint's."""
    if (run / "samples.npy").is_file():
        from fedhmc.runtime.export import load_samples

        return load_samples(run)
    from fedhmc.runtime import checkpoint

    checkpoint.peek(run)  # a checkpoint of another fedhmc: refused, in one line
    try:
        state, _ = checkpoint.load(run)
    except ConfigError:
        state = {}
    draws = state.get("draws")
    if draws is None:
        raise ConfigError(
            f"{run} keeps no draws (no samples.npy, none in its checkpoint); run it with "
            "--save-samples"
        )
    return draws.detach().cpu().numpy()


MIN_DRAWS = 4
"""Draws per chain below which split R̂ and ESS mean nothing (each half holds 2)."""


def check_enough(run: Path, draws: np.ndarray) -> None:
    """A one-line ``ConfigError`` that asks for what is missing: more chains when the run
    has one, more rounds when its chains hold too few draws."""
    if draws.ndim != 3:
        raise ConfigError(
            f"{run} has draws of shape {draws.shape}, not (draws, chains, d); run it again "
            "with --save-samples"
        )
    n, chains = int(draws.shape[0]), int(draws.shape[1])
    if chains < 2:
        raise ConfigError(
            f"{run} has 1 chain: R-hat and ESS compare chains, so diagnostics need 2 or more; "
            "run it again with --chains 4"
        )
    if n < MIN_DRAWS:
        more = _rounds_for(run, MIN_DRAWS)
        how = f"{_resume(run)} --rounds " + (str(more) if more is not None else "with more rounds")
        raise ConfigError(
            f"{run} has only {n} draw{'s' if n != 1 else ''} per chain ({chains} chains): "
            f"diagnostics need at least {MIN_DRAWS}, and a draw is kept each --thin rounds "
            f"after the burn-in; run more rounds: {how}"
        )


def _rounds_for(run: Path, draws: int) -> int | None:
    """The --rounds at which the run in ``run`` will have kept ``draws`` draws per chain
    (None when its config.json cannot say)."""
    try:
        from fedhmc.runtime.config import RunConfig
        from fedhmc.runtime.loop import is_collect_round

        cfg = RunConfig.from_mapping(loads_json((run / "config.json").read_text()))
        kept = 0
        for r in range(1, 10_000_000):
            kept += is_collect_round(cfg, r)
            if kept >= draws:
                return max(r, int(cfg.rounds or 0) + 1)
    except Exception:  # noqa: BLE001 - a hint only: without it the message stays true
        return None
    return None


def _resume(run: Path) -> str:
    """``fedhmc run --resume RUN`` with what the resume needs besides the folder (the
    ``--model`` of the user's own model: a folder never names code that runs)."""
    from fedhmc.runtime.checkpoint import resume_command

    try:
        saved = loads_json((run / "config.json").read_text())
    except (OSError, ValueError):
        saved = None
    return resume_command(run, saved if isinstance(saved, dict) else {})


def parameter_names(run: Path, dim: int) -> list[str]:
    """A name per coordinate of θ, such as ``conv1.weight[0,0,1,2]`` or ``theta[7]``."""
    from fedhmc.runtime.export import param_layout

    def read(name):
        try:
            return loads_json((run / name).read_text())
        except (OSError, ValueError):
            return {}

    names = [""] * dim
    for name, _, idx in param_layout(read("config.json"), read("summary.json"), dim):
        for pos in np.ndindex(idx.shape):
            names[int(idx[pos])] = f"{name}[{','.join(map(str, pos))}]"
    return names


def cmd_diagnose(args) -> int:
    from fedhmc.analysis import diagnostics as dg

    run = Path(args.run_dir)
    if not (run / "config.json").is_file():
        raise ConfigError(f"{run} has no config.json; is it a fedhmc run directory?")
    if args.top < 1:
        raise ConfigError(f"--top must be ≥ 1, got {args.top}")
    draws = load_draws(run)
    check_enough(run, draws)
    diag = dg.convergence_summary(draws)
    head = f"{run}: {draws.shape[0]} draws × {draws.shape[1]} chains, {draws.shape[2]} parameters"
    if not math.isfinite(diag["rhat_max"]):  # every parameter constant: nothing to rank
        print(f"{head}; warning: {dg.warning(diag)}")
        return 0
    if dg.too_short(diag):
        print(
            f"{head}; R-hat and ESS need about {dg.RELIABLE_DRAWS} draws per chain, so the "
            "figures below are unreliable and only rank the parameters"
        )
    else:
        print(
            f"{head}; R-hat max {diag['rhat_max']:.3f}, bulk ESS min {diag['ess_min']:.0f}, "
            f"tail ESS min {diag['ess_tail_min']:.0f}"
        )
    print_worst(run, draws, args.top)
    text = dg.warning(diag)
    if text and dg.too_short(diag):
        more = _rounds_for(run, dg.RELIABLE_DRAWS)
        if more is not None:
            text += f": {_resume(run)} --rounds {more}"
    if text:
        print(f"warning: {text}")
    return 0


def print_worst(run: Path, draws: np.ndarray, top: int) -> None:
    """The table of the ``top`` parameters of highest R̂, with their bulk and tail ESS."""
    from fedhmc.analysis.diagnostics import per_parameter

    stats = per_parameter(draws)
    names = parameter_names(run, draws.shape[2])
    rhat = np.where(np.isfinite(stats["rhat"]), stats["rhat"], -np.inf)
    order = np.argsort(-rhat, kind="stable")[:top]
    width = max(len("parameter"), *(len(names[i]) for i in order))
    print(f"  {'parameter':<{width}}  {'R-hat':>7}  {'bulk ESS':>9}  {'tail ESS':>9}")
    for i in order:
        print(
            f"  {names[i]:<{width}}  {stats['rhat'][i]:7.3f}  {stats['ess_bulk'][i]:9.0f}  "
            f"{stats['ess_tail'][i]:9.0f}"
        )
