"""``fedhmc run``: one run, on the engine or on Flower's simulation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedhmc.cli.options import config_from_args, config_values, print_final_table, resume_config
from fedhmc.errors import ConfigError
from fedhmc.runtime.threads import parse_threads


def check_resume(run_dir: str, cfg, given: dict) -> None:
    """The refusals of a resume, before anything is printed or run: the folder in use by
    another process, no readable checkpoint, a checkpoint of another configuration
    (named as the user's own option when given, else as the folder's), or a metrics.csv
    that is not what the checkpoint says the run wrote."""
    from fedhmc.runtime import checkpoint
    from fedhmc.runtime.lock import FolderLock
    from fedhmc.runtime.output import check_metrics_file

    FolderLock(run_dir).acquire().release()  # in use: refused now, in one line
    header = checkpoint.peek(run_dir)
    if header is None or not isinstance(header.get("config"), dict):
        header, _ = checkpoint.load(run_dir)  # no config in the header: read it whole
        header = {**header, "version": header["_header"]["version"]}
    saved, reached, version = header["config"], header["round"], header["version"]
    checkpoint.check_resumable(saved, reached, version, cfg, given)
    check_metrics_file(run_dir, header.get("metrics"), int(reached))


def _out_of_memory(cfg, exc: BaseException) -> ConfigError:
    """An allocation failure as one line: what failed, how to need less, and where the
    run's checkpoint is (to continue with ``--resume``) when one was written."""
    from fedhmc_datasets.memory import out_of_memory_detail

    from fedhmc.runtime import checkpoint

    fix = (
        "use fewer --chains or --num-clients (or --clients-per-round), a smaller "
        "--batch-size, a smaller model or less data"
    )
    out = getattr(cfg, "out", None)
    if out and (Path(out) / checkpoint.NAME).exists():
        tail = "the checkpoint is kept: continue with " + checkpoint.resume_command(
            out, cfg.to_dict()
        )
    elif out and Path(out).exists():
        tail = f"no round was checkpointed: start again with --overwrite --out {out}"
    elif out:
        tail = "nothing was written"
    else:
        tail = "a checkpoint, if one was written, is in its folder under runs/ (--resume it)"
    return ConfigError(f"out of memory ({out_of_memory_detail(exc)}); {fix}; {tail}")


def cmd_run(args: argparse.Namespace) -> int:
    if getattr(args, "resume_dir", None):
        given = config_values(args)
        if "out" in given:
            raise ConfigError("--resume DIR continues the run in DIR; drop --out")
        if given.get("overwrite"):
            raise ConfigError(
                "--resume DIR continues the run in DIR and --overwrite replaces it; pick one"
            )
        # Resolved once, here: refusals (another data file, data in memory) come first.
        cfg = resume_config(args.resume_dir, given).resolve()
        check_resume(args.resume_dir, cfg, given)  # then the checkpoint's, silently
    else:
        from fedhmc.runtime.config import refuse_unused

        cfg = config_from_args(args).resolve()  # once: the backend takes it as it is
        refuse_unused(cfg, config_values(args))  # no option accepted without effect
    from fedhmc_datasets.memory import is_out_of_memory

    from fedhmc.core.progress import set_quiet
    from fedhmc.runner import run_config

    set_quiet(args.quiet)

    try:
        result = run_config(cfg, progress=not args.quiet, threads=parse_threads(args.threads))
    except (MemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        raise _out_of_memory(cfg, e) from None
    if not args.quiet:
        print_final_table(result)
    warn = result.summary.get("convergence_warning")
    if warn:
        print(f"fedhmc run: warning: {warn}", file=sys.stderr)
    return 0
