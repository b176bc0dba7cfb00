import os

import pytest
import torch

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    yield


@pytest.fixture(autouse=True)
def _fresh_process_switches():
    """The command line's process-wide switches (``--quiet``, ``--threads``) set by one
    test's ``main([...])`` must not reach the next test."""
    from fedhmc.core.progress import set_quiet
    from fedhmc.runtime.threads import set_default_threads

    set_quiet(False)
    set_default_threads(None)
    yield
    set_quiet(False)
    set_default_threads(None)


@pytest.fixture
def cli(capsys):
    """``fedhmc`` in this process: ``cli(*argv) -> (exit status, stdout, stderr)``."""
    from fedhmc.cli.main import main

    def call(*argv):
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
        got = capsys.readouterr()
        return code, got.out, got.err

    return call
