"""``fedhmc sweep``: a grid of runs, resumable, in parallel, as one tidy table.

A sweep is a cartesian product of settings (``--grid "step-size=1e-3,3e-3 seed=0,1"`` or
the ``[grid]`` table of a TOML file) on top of fixed base settings (the ``fedhmc run``
options given on the command line, or the file's ``[base]`` table). Every cell runs into
its own directory ``DIR/cells/<cell-id>/`` with the usual ``config.json``, ``metrics.csv``
and ``summary.json``; ``<cell-id>`` is a readable prefix of the cell's grid values and a
short hash of all its settings, so the same cell always lands in the same directory.

A cell whose ``summary.json`` says ``"status": "completed"`` with the same config is not
run again, so a sweep that stops (Ctrl-C, a killed job) resumes where it stopped and loses
at most the cells in flight. A cell that fails (a diverged chain, a bad setting found at
run time) is recorded with its status and the sweep goes on.

At the end the combined table ``DIR/results.csv`` (one row per cell and round, every
setting and every metric as columns) is rebuilt from the cells' files, a summary over
seeds is printed, and with ``--select best-by=METRIC`` the best step size per setting is
picked and written to ``DIR/selected.csv``.
"""

from fedhmc.sweep.cells import (
    FolderLock,
    cell_done,
    pending_cells,
    run_cell,
    run_cells,
    run_sweep,
    same_run_settings,
)
from fedhmc.sweep.grid import cell_id, expand_grid, load_sweep_file, parse_grid
from fedhmc.sweep.table import (
    build_table,
    final_rows,
    format_mean_std,
    format_summary,
    mean_std,
    read_csv,
    read_table,
    select_best,
    summarize,
    write_table,
)

__all__ = [
    "FolderLock",
    "build_table",
    "cell_done",
    "cell_id",
    "expand_grid",
    "final_rows",
    "format_mean_std",
    "format_summary",
    "load_sweep_file",
    "mean_std",
    "parse_grid",
    "pending_cells",
    "read_csv",
    "read_table",
    "run_cell",
    "run_cells",
    "run_sweep",
    "same_run_settings",
    "select_best",
    "summarize",
    "write_table",
]
