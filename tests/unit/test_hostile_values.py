"""Values a hostile user gives that once ended in a traceback or in another library's
words: each is refused in one line that names the option, with exit status 2, before
anything is written."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--step-size", "1e308"], "--step-size 1e+308 is too large (at most 1e+15"),
        (["--dataset", "gaussian-hetero", "--dim", "0"], "--dim must be ≥ 1, got 0"),
        (["--dataset", "gaussian-hetero", "--dim", "-3"], "--dim must be ≥ 1, got -3"),
        (["--seed", "4294967296"], "--seed must be an integer in [0, 4294967295]"),
        (["--seed", "-1"], "--seed must be an integer in [0, 4294967295]"),
        (["--threads", "100000"], "--threads 100000: this machine has"),
    ],
    ids=["step-size-overflow", "dim-0", "dim-negative", "seed-33-bits", "seed-negative",
         "threads"],
)  # fmt: skip
def test_a_hostile_value_is_one_line(cli, tmp_path, argv, line):
    out = tmp_path / "run"
    code, stdout, stderr = cli("run", *argv, "--rounds", "1", "--out", out)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fedhmc run: error: {line}"), stderr
    assert "Traceback" not in stderr and not out.exists()
