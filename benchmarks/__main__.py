"""``python -m benchmarks``: the performance suite (see :mod:`benchmarks.suite`)."""

from benchmarks.suite import cli

raise SystemExit(cli())
