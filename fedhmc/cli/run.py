"""``fedhmc run``: one run, on the engine or on Flower's simulation."""

from __future__ import annotations

import argparse

from fedhmc.cli.options import config_from_args, config_values, print_final_table, resume_config
from fedhmc.errors import ConfigError
from fedhmc.runtime.threads import parse_threads


def _note_extension(run_dir: str, cfg) -> None:
    """One line on stderr when ``--rounds`` extends the run: which burn-in it keeps."""
    import json
    import sys
    from pathlib import Path

    try:
        before = json.loads((Path(run_dir) / "config.json").read_text()).get("rounds")
    except (OSError, ValueError):
        return
    if isinstance(before, int) and cfg.rounds > before:
        s = "" if cfg.burn_in == 1 else "s"
        print(
            f"fedhmc run: extending {run_dir} from {before} to {cfg.rounds} rounds; it keeps its "
            f"burn-in of {cfg.burn_in} round{s}, as an uninterrupted run with --rounds "
            f"{cfg.rounds} --burn-in {cfg.burn_in}",
            file=sys.stderr,
        )


def cmd_run(args: argparse.Namespace) -> int:
    if getattr(args, "resume_dir", None):
        given = config_values(args)
        if "out" in given:
            raise ConfigError("--resume DIR continues the run in DIR; drop --out")
        if given.get("overwrite"):
            raise ConfigError(
                "--resume DIR continues the run in DIR and --overwrite replaces it; pick one"
            )
        cfg = resume_config(args.resume_dir, given)
        cfg.resolve()  # refusals (another data file, data given in memory) come first
        _note_extension(args.resume_dir, cfg)
    else:
        cfg = config_from_args(args)
    from fedhmc.core.progress import set_quiet
    from fedhmc.runtime.backends import run_config

    set_quiet(args.quiet)

    result = run_config(cfg, progress=not args.quiet, threads=parse_threads(args.threads))
    if not args.quiet:
        print_final_table(result)
    warn = result.summary.get("convergence_warning")
    if warn:
        import sys

        print(f"fedhmc run: warning: {warn}", file=sys.stderr)
    return 0
