"""The ``fedhmc`` command line: the parser of every subcommand and the entry point.

Errors a user can cause print one line and exit with status 2; there is no traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys

from fedhmc.cli.options import _Parser, add_config_options, add_threads_option
from fedhmc.cli.run import cmd_run
from fedhmc.errors import DISK_FULL, FedHMCError, RunInterrupted


def version() -> str:
    """The installed distribution's version, or the package's own where it is not installed
    (the source tree on the path)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("fedhmc")
    except PackageNotFoundError:
        from fedhmc import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fedhmc",
        description="Federated Averaging Hamiltonian Monte Carlo (FA-HMC) on one machine "
        "or on Flower.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    p_run = sub.add_parser(
        "run",
        help="run FA-HMC (or FA-LD) and write config.json, metrics.csv, summary.json",
        description="Run FA-HMC and write config.json, metrics.csv and summary.json to --out.",
    )
    add_config_options(p_run)
    p_run.add_argument(
        "--resume",
        dest="resume_dir",
        metavar="DIR",
        help="continue the stopped (or finished) run in DIR from its checkpoint, to its "
        "--rounds or to a larger --rounds given here. The run keeps its own --burn-in, the "
        "number of rounds in DIR/config.json (by default 10%% of the first --rounds, not of "
        "the new one), so the result equals an uninterrupted run with the new --rounds and "
        "that --burn-in; an extension says so in one line",
    )
    p_run.add_argument("--quiet", action="store_true", help="no progress bar or final table")
    add_threads_option(p_run)
    p_run.set_defaults(func=cmd_run)
    _add_data_command(sub)
    from fedhmc.cli.experiment import add_experiment_command

    add_experiment_command(sub)
    from fedhmc.cli.sweep import add_sweep_command

    add_sweep_command(sub)
    from fedhmc.cli.plot import add_plot_command

    add_plot_command(sub)
    from fedhmc.cli.export import add_export_command

    add_export_command(sub)
    from fedhmc.cli.diagnose import add_diagnose_command

    add_diagnose_command(sub)
    return parser


def _add_data_command(sub) -> None:
    try:
        from fedhmc.cli.data import add_data_command
    except ImportError:  # pragma: no cover - the data command ships with the datasets
        return
    add_data_command(sub)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt as e:  # (before a subcommand ran: nothing was written)
        print("fedhmc: interrupted", file=sys.stderr)
        return 128 + getattr(e, "signum", signal.SIGINT)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the subcommand's parser, so that the error points to its --help
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        target = commands.choices.get(getattr(args, "command", None), parser)
        target.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except RunInterrupted as e:
        print(f"fedhmc {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except FedHMCError as e:
        print(f"fedhmc {args.command}: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)  # 2: bad input; 1: a run that failed
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        print(
            f"fedhmc {args.command}: error: the disk is full ({e.strerror}: "
            f"{e.filename or 'writing a file'}); free some space and run it again",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt as e:
        print(
            f"fedhmc {args.command}: interrupted; the files written so far are valid",
            file=sys.stderr,
        )
        return 128 + getattr(e, "signum", signal.SIGINT)  # 130, or 143 for SIGTERM


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
