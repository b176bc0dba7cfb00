"""Former entry point of the benchmark, kept so that ``python -m benchmarks.engine_throughput
--smoke`` (CI) keeps working: it runs the suite, ``python -m benchmarks`` (see
:mod:`benchmarks.suite`), with the same arguments.
"""

from __future__ import annotations

from benchmarks.suite import cli, main  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(cli())
