"""``tools/gpu_check.sh`` in a lent GPU machine's conditions, on the CPU: torch and
fedhmc's small dependencies, no Flower, no Ray, no fedhmc install (``tools/bare_env.py``),
``DEVICE=cpu SMOKE=1``. Every step finishes, the Flower tests skip themselves, and the
summary says what ran."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

pytestmark = pytest.mark.slow


def test_the_gpu_check_runs_where_only_torch_is(tmp_path):
    import bare_env

    python = bare_env.make(tmp_path / "bare")
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "SMOKE": "1",
        "TIME_SCALE": "10",  # (a limit is not what this test checks)
        "PYTHON": str(python),
        "OUT": str(tmp_path / "out"),
    }
    env.pop("PYTHONPATH", None)  # (a Flower test may leave one in this process)
    hidden = "import importlib.util as u; print(u.find_spec('flwr'), u.find_spec('ray'))"
    probe = subprocess.run(
        [str(python), "-c", hidden], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert probe.stdout.split() == ["None", "None"], probe.stderr
    proc = subprocess.run(
        ["bash", "tools/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [line.split("\t") for line in (tmp_path / "out" / "steps.tsv").read_text().splitlines()]
    assert [(s[0], s[1]) for s in steps] == [
        ("probe", "0"), ("matrix", "0"), ("speed", "0"), ("authors", "0"),
    ]  # fmt: skip
    summary = (tmp_path / "out" / "gpu-check.md").read_text()
    assert "flwr **no**, ray **no**" in summary
    assert "ECE the same bits in 5 evaluations: yes; equal to the CPU's: yes" in summary
    assert "LeNet-5's client gradients the same bits every time: yes" in summary
    assert ", 0 failed," in summary and "| fedhmc / plain |" in summary


def test_the_gpu_check_says_what_a_machine_lacks(tmp_path):
    import bare_env

    python = bare_env.make(tmp_path / "bare", ("flwr", "ray", "fedhmc", "sklearn", "scikit_learn"))
    env = {**os.environ, "DEVICE": "cpu", "PYTHON": str(python), "OUT": str(tmp_path / "out")}
    env.pop("PYTHONPATH", None)  # (what the bare Python sees is its own, and the sources)
    proc = subprocess.run(
        ["bash", "tools/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and not (tmp_path / "out" / "steps.tsv").exists()
    assert proc.stderr.strip().splitlines() == [
        f"tools/gpu_check.sh: {python} lacks sklearn; send their wheels in .gpu-whl (FULL=1 "
        "bash tools/gpu_prepare.sh) or install them there"
    ]
