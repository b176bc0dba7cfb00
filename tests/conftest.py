import os

import pytest
import torch

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    yield
