"""`--tensorboard DIR`: every round's metrics and the step size, for `tensorboard --logdir`."""

from __future__ import annotations

import csv

import pytest

from fedhmc.cli.main import main

pytest.importorskip("tensorboard", reason="the optional extra fedhmc[tensorboard] is missing")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


def scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def rows(run_dir) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_every_round_is_logged_and_a_resumed_run_has_no_duplicates(tmp_path):
    out, tb = tmp_path / "run", tmp_path / "tb"
    base = ["run", "--rounds", "3", "--local-steps", "2", "--quiet", "--step-size", "0.01"]
    assert main([*base, "--out", str(out), "--tensorboard", str(tb)]) == 0
    assert main(["run", "--resume", str(out), "--rounds", "5", "--quiet"]) == 0
    s = scalars(tb)
    want = rows(out)
    assert [step for step, _ in s["metrics/accuracy"]] == [1, 2, 3, 4, 5]
    for step, value in s["metrics/nll_mean"]:
        assert value == pytest.approx(float(want[step - 1]["nll_mean"]), rel=1e-6)
    assert s["sampler/step_size"] == [(r, pytest.approx(0.01)) for r in range(1, 6)]
    assert "metrics/energy_error" in s and "metrics/grad_evals" in s


def test_tensor_values_are_logged_through_the_cpu(tmp_path, monkeypatch):
    """A metric that arrives as a tensor (on a GPU, ``float`` would work but ``numpy`` would
    not) is logged as its number; a row's values are read with ``.item()``, never ``.numpy()``."""
    import torch

    from fedhmc.runtime.output import TensorBoardLog

    def no_numpy(self, *a, **k):
        raise AssertionError("numpy() of a tensor that may be on a GPU")

    monkeypatch.setattr(torch.Tensor, "numpy", no_numpy)
    log = TensorBoardLog(tmp_path / "tb", {"step_size": 0.1})
    log.log({"round": torch.tensor(1), "accuracy": torch.tensor(0.5), "nll_mean": 1.5})
    log.log({"round": 2, "accuracy": torch.tensor(0.75, dtype=torch.float64), "flag": True})
    log.close()
    s = scalars(tmp_path / "tb")
    assert s["metrics/accuracy"] == [(1, 0.5), (2, 0.75)]
    assert s["metrics/nll_mean"] == [(1, 1.5)] and "metrics/flag" not in s


def test_a_sweep_logs_one_run_per_cell(tmp_path):
    from fedhmc.sweep.cells import run_sweep

    tb = tmp_path / "tb"
    base = {"rounds": 2, "local_steps": 1, "tensorboard": str(tb)}
    run_sweep(tmp_path / "sweep", {"leapfrog_steps": [1, 3]}, base, progress=False, log=str)
    runs = sorted(p for p in tb.iterdir() if p.is_dir())
    assert len(runs) == 2
    for r in runs:
        assert [step for step, _ in scalars(r)["metrics/accuracy"]] == [1, 2]


def test_missing_tensorboard_is_one_line(tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def blocked(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("no tensorboard")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", blocked)
    code = main(
        [
            "run",
            "--rounds",
            "1",
            "--quiet",
            "--out",
            str(tmp_path / "r"),
            "--tensorboard",
            str(tmp_path / "tb"),
        ]
    )
    assert code == 2
    assert "fedhmc[tensorboard]" in capsys.readouterr().err
    assert not (tmp_path / "r" / "metrics.csv").exists()  # nothing written
