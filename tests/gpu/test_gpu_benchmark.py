"""``python -m benchmarks --only gpu`` without a GPU: a one-line refusal, and ``--device cpu``
times its toy shapes (not marked ``gpu``: these need no device)."""

from __future__ import annotations

import pytest
import torch

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@no_cuda
@pytest.mark.parametrize("argv", [["--only", "gpu"], ["--only", "gpu", "--device", "cuda:1"]])
def test_gpu_group_refuses_without_a_gpu(argv, capsys):
    from benchmarks.suite import cli

    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "the gpu group needs a GPU" in err and "add --device cpu" in err


@no_cuda
def test_smoke_without_a_gpu_runs_on_the_cpu():
    from benchmarks.gpu import resolve_device

    assert resolve_device(None, smoke=True) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_speed_rows_on_the_cpu(tmp_path):
    from benchmarks import gpu

    data = gpu._synthetic_fmnist(str(tmp_path), 16, 20)
    for shape in gpu.SMOKE_SHAPES:
        row = gpu.bench_speed_shape(data, shape, torch.device("cpu"), 1, 1, 1, 1)
        assert row["plain"] == "eager (CPU)"
        assert row["fedhmc_step_ms"] > 0 and row["plain_step_ms"] > 0
        assert row["fedhmc/plain"] > 0 and row["steps"] == 2  # T (K + 1)
    text = gpu.render(
        {"device": "cpu", "device_name": "CPU", "speed": {"rows": [row], "notes": []}}
    )
    assert "LeNet-5 N=10 B=4" in text and "fedhmc / plain" in text


def test_the_authors_run_reruns_the_results_page_cell():
    """The report's authors' row reruns the committed CPU cell (2 rounds in a smoke run) and
    compares its metrics with the cell's at that round: on the CPU they agree."""
    from benchmarks import gpu
    from benchmarks.common import fmnist_available, fmnist_missing

    if not fmnist_available():
        pytest.skip(fmnist_missing())
    a = gpu.bench_authors(torch.device("cpu"), smoke=True)
    assert a["rounds"] == 2 and not a["cuda_graphs"]
    assert a["max_rel"] <= 1e-6  # the same chain, up to the threads' float32 sums
    assert a["metrics"]["accuracy"] == a["cpu_metrics"]["accuracy"]
    report = {"device": "cuda", "device_name": "H", "authors": {**a, "rounds": 200}}
    rows = {measure: ok for measure, _, _, ok in gpu.targets(report)}
    assert len(rows) == 2 and any("seconds" in m for m in rows)
    assert "200 rounds (T = 50" in gpu.render(report)
    far = {**a, "max_rel": 0.5}
    assert not all(
        ok for *_, ok in gpu.targets({"device": "cpu", "device_name": "C", "authors": far})
    )
