"""The ``fedhmc`` command line.

``fedhmc run`` takes one option per :class:`~fedhmc.config.RunConfig` field, in kebab-case
(the same keys as Flower's run config). Errors a user can cause print one line and exit
with status 2; there is no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import typing

from .config import RunConfig
from .errors import ConfigError, FedHMCError, RunInterrupted


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_config_options(parser: argparse.ArgumentParser, only: set[str] | None = None) -> None:
    """One option per RunConfig field (or per field in ``only``); unset options stay absent,
    so the dataset defaults apply."""
    hints = typing.get_type_hints(RunConfig)
    groups = {
        "dataset": parser.add_argument_group("data and model"),
        "algorithm": parser.add_argument_group("sampler"),
        "rounds": parser.add_argument_group("run"),
        "round_timeout": parser.add_argument_group("flower backend"),
        "out": parser.add_argument_group("output"),
    }
    group = parser
    for f in dataclasses.fields(RunConfig):
        if only is not None and f.name not in only:
            continue
        if only is None and f.name == "resume":
            continue  # `fedhmc run --resume DIR` takes the run directory (cmd_run)
        group = groups.get(f.name, group) if only is None else parser
        flag = "--" + f.name.replace("_", "-")
        help_ = f.metadata["help"]
        default = f.default
        if hints[f.name] is bool:
            group.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=help_)
            continue
        if hints[f.name] == (bool | None):  # unset: the protocol decides; --no-X turns it off
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_
            )
            continue
        if default is not None:
            help_ += f" (default: {default})"
        choices = f.metadata.get("choices")
        group.add_argument(
            flag,
            default=argparse.SUPPRESS,
            choices=choices,
            metavar=f.name.upper() if choices is None else None,
            help=help_,
        )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    names = {f.name for f in dataclasses.fields(RunConfig)}
    return RunConfig.from_mapping({k: v for k, v in vars(args).items() if k in names})


def _format_value(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}" if abs(v) < 1e4 else f"{v:.1f}"
    return str(v)


def print_final_table(result) -> None:
    final = result.final
    s = result.summary
    rows = [(k, _format_value(v)) for k, v in final.items() if k not in ("round",)]
    rows += [
        ("rounds", str(s.get("rounds_completed"))),
        ("grad evals/s", f"{s.get('grad_evals_per_s', 0):,.0f}"),
        ("bytes total", f"{s.get('bytes_total', 0):,}"),
        ("output", str(result.config.out)),
    ]
    diag = s.get("diagnostics")
    if diag:
        rows.insert(-1, ("R-hat max", f"{diag['rhat_max']:.3f} (split, across chains)"))
        rows.insert(-1, ("ESS min", f"{diag['ess_min']:.1f} (median {diag['ess_median']:.1f})"))
    width = max(len(k) for k, _ in rows)
    print(
        f"fedhmc run: {result.config.dataset}, {result.config.algorithm}, "
        f"K={result.config.leapfrog_steps} T={result.config.local_steps} "
        f"η={result.config.step_size:g} ρ={result.config.rho:g}"
    )
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def resume_config(run_dir: str, given: dict) -> RunConfig:
    """The config of the run in ``run_dir`` with the options given now (only ``--rounds``
    may differ from the checkpoint's; the check names any other difference)."""
    import json
    from pathlib import Path

    path = Path(run_dir) / "config.json"
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"--resume {run_dir}: no readable config.json there ({e}); is it a run directory?"
        ) from None
    merged = {**saved, **given, "out": str(run_dir), "resume": True, "overwrite": False}
    return RunConfig.from_mapping(merged)


def cmd_run(args: argparse.Namespace) -> int:
    if getattr(args, "resume_dir", None):
        names = {f.name for f in dataclasses.fields(RunConfig)}
        given = {k: v for k, v in vars(args).items() if k in names}
        if "out" in given:
            raise ConfigError("--resume DIR continues the run in DIR; drop --out")
        cfg = resume_config(args.resume_dir, given)
    else:
        cfg = config_from_args(args)
    if cfg.backend == "flower":
        from fedhmc_server.simulation import run_flower  # lazy: the core never imports flwr

        result = run_flower(cfg, progress=not args.quiet)
    else:
        from .engine import run

        result = run(cfg, progress=not args.quiet)
    if not args.quiet:
        print_final_table(result)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fedhmc",
        description="Federated Averaging Hamiltonian Monte Carlo (FA-HMC) on one machine "
        "or on Flower.",
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
        "--rounds or to a larger --rounds given here; the result equals an uninterrupted run",
    )
    p_run.add_argument("--quiet", action="store_true", help="no progress bar or final table")
    p_run.set_defaults(func=cmd_run)
    _add_data_command(sub)
    from .experiments import add_experiment_command

    add_experiment_command(sub)
    from .sweep import add_sweep_command

    add_sweep_command(sub)
    from .plots import add_plot_command

    add_plot_command(sub)
    from .export import add_export_command

    add_export_command(sub)
    return parser


def _add_data_command(sub) -> None:
    try:
        from .data_cli import add_data_command
    except ImportError:  # pragma: no cover - the data command ships with the datasets
        return
    add_data_command(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
        return 2
    except KeyboardInterrupt:
        print(
            f"fedhmc {args.command}: interrupted; the files written so far are valid",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
