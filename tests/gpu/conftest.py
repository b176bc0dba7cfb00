"""The device under test of ``pytest -m gpu`` (``$FEDHMC_TEST_DEVICE``, ``cuda`` by default),
and, when ``$FEDHMC_GPU_REPORT`` names a file, one JSON line per test for
``python -m benchmarks --only gpu`` (outcome, seconds, the recorded differences)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from gpu_cells import device_name, no_float64, unavailable

REPORT_ENV = "FEDHMC_GPU_REPORT"


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    """The CPU side of every cell on one thread: these problems are tiny, and two threads
    on a busy two-core machine made a CNN cell 40 times slower (spinning OpenMP workers)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device under test; skips the test when this machine does not have it."""
    name = device_name()
    why = unavailable(name)
    if why is not None:
        pytest.skip(why)
    return torch.device(name)


@pytest.fixture
def device64(device) -> torch.device:
    """The device under test, for the float64 cells (skipped on MPS, which has no float64)."""
    why = no_float64(device)
    if why is not None:
        pytest.skip(why)
    return device


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    if report.when != "call" and report.outcome == "passed":
        return  # setup and teardown that passed: the call's line says it
    message = ""
    if report.outcome != "passed":
        if report.skipped and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2])
        else:
            message = str(getattr(report, "longreprtext", "") or report.longrepr or "")
            lines = [ln for ln in message.splitlines() if ln.startswith("E ")]
            message = " ".join(ln[1:].strip() for ln in lines[:3]) or message[-500:]
    line = {
        "test": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "seconds": report.duration,
        "properties": {k: v for k, v in report.user_properties},
        "message": message[:1000],
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, default=str) + "\n")
