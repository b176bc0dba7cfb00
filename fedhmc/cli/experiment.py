"""``fedhmc experiment NAME``: run a preset of the papers' experiments."""

from __future__ import annotations

import argparse
import inspect
import os
import time
from pathlib import Path

from fedhmc.cli.options import add_threads_option
from fedhmc.core.progress import set_quiet
from fedhmc.errors import ConfigError
from fedhmc.experiments import EXPERIMENTS
from fedhmc.runtime.threads import set_default_threads
from fedhmc.sweep.table import fmt


def add_experiment_command(sub) -> None:
    p = sub.add_parser(
        "experiment",
        help="run one of the papers' experiments (tables and plots)",
        description="Run one of the papers' experiments; it writes a CSV table, a JSON "
        "summary and a PNG plot to --out.",
    )
    p.add_argument("name", nargs="?", choices=list(EXPERIMENTS), metavar="NAME")
    p.add_argument("--out", help="output directory (default runs/<time>-<name>)")
    p.add_argument("--quick", action="store_true", help="a small version, in seconds")
    p.add_argument(
        "--full",
        action="store_true",
        help="the full budget: the paper's own, or for samplers the comparison's larger one "
        "(hours on 2 CPU cores for the data experiments)",
    )
    p.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="paper-*, participation and samplers: cells run in this many processes at once "
        "(default: 1)",
    )
    p.add_argument(
        "--neighbour-eta",
        action="store_true",
        help="paper-fmnist-*: also run the best row of the authors' protocol at the next "
        "smaller grid η, same seeds and rounds (η is tuned at fewer rounds than it runs)",
    )
    p.add_argument("--list", action="store_true", help="list the experiments")
    p.add_argument(
        "--data-dir", help="directory holding the dataset files (sets FEDHMC_DATA for the run)"
    )
    p.add_argument(
        "--device",
        help="torch device of the experiments that run on data (fmnist-*, kmnist, cifar2, "
        "participation, paper-fmnist-*): cpu, cuda or cuda:N; their cells share it "
        "(default: cpu)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars and no table")
    add_threads_option(p)
    p.set_defaults(func=cmd_experiment)


def cmd_experiment(args: argparse.Namespace) -> int:
    if args.list or args.name is None:
        import sys

        stream = sys.stdout if args.list else sys.stderr
        if not args.list:
            print("usage: fedhmc experiment NAME [options]; the experiments:", file=stream)
        from fedhmc.experiments import DURATIONS

        width = max(len(k) for k in EXPERIMENTS)
        for name, (_, text) in EXPERIMENTS.items():
            default, full = DURATIONS.get(name, ("not measured", "not measured"))
            took = f"[default: {default}" + (f"; --full: {full}]" if full else "]")
            print(f"{name:<{width}}  {text} {took}", file=stream)
        return 0 if args.list else 2
    fn, _ = EXPERIMENTS[args.name]
    # Every option is checked before the output folder is made: a refusal leaves nothing.
    if args.workers != 1:
        if "workers" not in inspect.signature(fn).parameters:
            raise ConfigError(f"{args.name} runs in one process; drop --workers")
        if args.workers < 1:
            raise ConfigError(f"--workers must be ≥ 1, got {args.workers}")
    if args.full:
        if args.quick:
            raise ConfigError("--quick and --full exclude each other; pick one")
        if "full" not in inspect.signature(fn).parameters:
            raise ConfigError(f"{args.name} has no --full budget; drop --full")
    if args.neighbour_eta and "neighbour_eta" not in inspect.signature(fn).parameters:
        raise ConfigError(f"{args.name} tunes no η per row; drop --neighbour-eta")
    if args.device is not None:
        _check_experiment_device(args.name, args.device)
    if args.data_dir and not Path(args.data_dir).expanduser().is_dir():
        raise ConfigError(
            f"--data-dir {args.data_dir}: no such folder; give the folder of the files"
        )
    out = Path(args.out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{args.name}")
    from fedhmc.runtime.lock import FolderLock

    # One process per folder, as for run and sweep: the lock is the folder's from here on.
    lock = FolderLock(out, "an experiment").acquire()
    ok = False
    try:
        code = _run_experiment(args, fn, out)
        ok = True
        return code
    finally:
        lock.release(discard=not ok)  # a refused experiment leaves no empty folder


def _run_experiment(args: argparse.Namespace, fn, out: Path) -> int:
    """cmd_experiment's body, run while the folder's lock is held."""
    from fedhmc.runtime.output import mark_folder

    mark_folder(out)
    if args.data_dir:
        os.environ["FEDHMC_DATA"] = str(Path(args.data_dir).expanduser().resolve())
    if args.device is not None:
        from fedhmc.sweep.cells import DEVICE_ENV

        os.environ[DEVICE_ENV] = args.device
    set_default_threads(args.threads)
    set_quiet(args.quiet)
    kwargs = {"quick": args.quick, "seed": args.seed}
    if args.workers != 1:
        kwargs["workers"] = args.workers
    if args.full:
        kwargs["full"] = True
    if args.neighbour_eta:
        kwargs["neighbour_eta"] = True
    summary = fn(out, **kwargs)
    rows = summary.get("rows", [])
    if rows and not args.quiet:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        print("  ".join(f"{k:>12}" for k in keys))
        for r in rows:
            print("  ".join(f"{fmt(r.get(k, '')):>12}" for k in keys))
    print(f"files in {out}")
    return 0


def _check_experiment_device(name: str, device: str) -> None:
    """Refuse, in one line, a device that experiment ``name`` cannot use or this machine
    lacks."""
    from fedhmc.experiments import DEVICE_EXPERIMENTS
    from fedhmc.runtime.config import check_device

    if name == "delayed-sgld":
        if device != "cpu":
            raise ConfigError(
                "delayed SGLD's workers share their chains in CPU memory and run on the CPU "
                f"by design; drop --device {device}"
            )
        return
    if name not in DEVICE_EXPERIMENTS and device != "cpu":
        raise ConfigError(
            f"{name} runs small closed-form targets on the CPU; drop --device {device}"
        )
    check_device(device)
