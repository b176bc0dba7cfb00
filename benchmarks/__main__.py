"""``python -m benchmarks``: the performance suite (see benchmarks/suite.py)."""

from benchmarks.suite import cli

raise SystemExit(cli())
