"""The run options shared by ``fedhmc run``, ``sweep`` and ``experiment``: one option per
[`RunConfig`][fedhmc.runtime.config.RunConfig] field, in kebab-case (the same keys as Flower's
run config).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing

from fedhmc.errors import ConfigError, loads_json
from fedhmc.runtime.config import (
    RunConfig,
    option_meanings,
    sampler_options,
    without_other_options,
)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):  # a prefix is not an option: --leapfrog-step fails
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_threads_option(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    """``--threads N|auto``: torch's intra-op threads (see `fedhmc.runtime.threads`)."""
    parser.add_argument(
        "--threads",
        default=default,
        metavar="N|auto",
        help="torch's intra-op threads: a number, or auto (one thread where a gradient "
        "evaluation is small, every core where it is large; measured by python -m benchmarks "
        f"--only threads) (default: {default})",
    )


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
        if f.metadata.get("internal"):
            continue  # filled in by fedhmc (config.json and Flower carry it)
        group = groups.get(f.name, group) if only is None else parser
        flag = "--" + f.name.replace("_", "-")
        help_ = f.metadata["help"] + shared_help(f.name)
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
        if f.name == "model_arg":  # repeatable: --model-arg a=1 --model-arg b=2
            group.add_argument(
                flag, action="append", default=argparse.SUPPRESS, metavar="KEY=VALUE", help=help_
            )
            continue
        group.add_argument(
            flag,
            default=argparse.SUPPRESS,
            choices=choices,
            metavar=f.name.upper() if choices is None else None,
            help=help_,
        )

    _add_sampler_options(groups["algorithm"] if only is None else parser, only)


def _add_sampler_options(target, only: set[str] | None) -> None:
    """One option per sampler option (`fedhmc.runtime.config.sampler_options`), whose help
    gives each sampler's meaning; a boolean one has a ``--no-`` form."""
    for o in sampler_options().values():
        if only is not None and o.name not in only:
            continue
        if o.type is bool:  # --fresh-gradients, --no-fresh-gradients
            target.add_argument(
                o.flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                help=o.help,
            )  # fmt: skip
            continue
        kind = o.type.__name__.upper() if not o.choices else None
        target.add_argument(
            o.flag, default=argparse.SUPPRESS, choices=o.choices or None, metavar=kind, help=o.help
        )


def shared_help(name: str) -> str:
    """What the run's setting ``name`` means for each sampler that declares it in its own
    Settings ("; qlsd, qlsd-pp: S, the clients drawn …"), or ""."""
    return "".join(f"; {', '.join(who)}: {h}" for h, (_, who) in option_meanings(name).items())


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return RunConfig.from_mapping(config_values(args))


def config_values(args: argparse.Namespace) -> dict:
    """The RunConfig fields given on the command line (repeated --model-arg joined)."""
    names = {f.name for f in dataclasses.fields(RunConfig)} | set(sampler_options())
    out = {k: v for k, v in vars(args).items() if k in names}
    if isinstance(out.get("model_arg"), list):
        out["model_arg"] = ";".join(out["model_arg"])
    return out


def _format_value(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}" if abs(v) < 1e4 else f"{v:.1f}"
    return str(v)


def print_final_table(result) -> None:
    from fedhmc.core.progress import format_rate

    final = result.final
    s = result.summary
    rows = [(k, _format_value(v)) for k, v in final.items() if k not in ("round",)]
    rows += [
        ("rounds", str(s.get("rounds_completed"))),
        ("grad evals/s", format_rate(s.get("grad_evals_per_s", 0))),
        ("bytes total", f"{s.get('bytes_total', 0):,}"),
        ("output", str(result.config.out)),
    ]
    diag = s.get("diagnostics")
    if diag:
        from fedhmc.analysis.diagnostics import summary_rows

        rows[-1:-1] = summary_rows(diag)
    width = max(len(k) for k, _ in rows)
    print(f"fedhmc run: {result.config.headline()}")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def _refuse_changed(saved: dict, given: dict, cfg: RunConfig) -> None:
    """A setting given for a resume that differs from the run's, refused in one line by
    its name before the run's settings and the new one are checked together (which would
    blame another option: ``--algorithm sgld`` on a FA-HMC run complained of its
    ``--leapfrog-steps``)."""
    from fedhmc.runtime.checkpoint import RESUMABLE_CHANGES

    try:
        run = RunConfig.from_mapping(saved)
    except ConfigError:
        return  # the run's own settings are refused by the checks that follow
    for key in given:
        was, now = getattr(run, key, None), getattr(cfg, key, None)
        if key not in RESUMABLE_CHANGES and was is not None and was != now:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(
                f"cannot resume: {flag} was {was!r} in the run and is {now!r} now; drop {flag} "
                "(only --rounds and --device may change) or start a new run"
            )


def resume_config(run_dir: str, given: dict) -> RunConfig:
    """The config of the run in ``run_dir`` with the options given now (only ``--rounds``
    may differ from the checkpoint's; the check names any other difference)."""
    from pathlib import Path

    path = Path(run_dir) / "config.json"
    try:
        saved = loads_json(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"--resume {run_dir}: no readable config.json there ({e}); is it a run directory?"
        ) from None
    if not isinstance(saved, dict):
        raise ConfigError(
            f"--resume {run_dir}: its config.json holds a JSON {type(saved).__name__}, not the "
            "object fedhmc writes; restore it, or start a new run"
        )
    from fedhmc.runtime.checkpoint import refuse_named_code

    refuse_named_code(run_dir, saved, given)  # before anything the folder names is imported
    if "device" in given and given["device"] != saved.get("device"):
        # Another device: how the run computes there is decided anew unless given.
        for key in ("cuda_graphs", "client_gpus", "compile"):
            if key not in given:
                saved.pop(key, None)
    saved = without_other_options(saved)  # (a run recorded with every sampler's options)
    merged = {**saved, **given, "out": str(run_dir), "resume": True, "overwrite": False}
    cfg = RunConfig.from_mapping(merged)
    _refuse_changed(saved, given, cfg)
    burn = saved.get("burn_in")
    if isinstance(burn, int) and cfg.rounds <= burn and "burn_in" not in given:
        raise ConfigError(
            f"--rounds {cfg.rounds} ends within the run's burn-in of {burn} rounds (a resumed "
            f"run keeps the burn-in in its config.json); give --rounds above {burn}"
        )
    return cfg
