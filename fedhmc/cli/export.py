"""``fedhmc export RUN_DIR --to arviz``: a run's draws as an ArviZ InferenceData file."""

from __future__ import annotations

from fedhmc.runtime.export import export_arviz


def add_export_command(sub) -> None:
    p = sub.add_parser(
        "export",
        help="export a run's draws (ArviZ InferenceData, netCDF)",
        description="Export the draws of a run made with --save-samples to another toolchain.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (fedhmc run --out)")
    p.add_argument("--to", choices=["arviz"], default="arviz", help="the format (default: arviz)")
    p.add_argument("--out", help="the file to write (default: RUN_DIR/posterior.nc)")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args) -> int:
    path = export_arviz(args.run_dir, args.out)
    print(f"fedhmc export: wrote {path} (arviz.from_netcdf to read it)")
    return 0
