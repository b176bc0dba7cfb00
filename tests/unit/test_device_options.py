"""Device options refused in one line (exit 2, nothing written), checked without a GPU."""

from __future__ import annotations

import pytest
import torch

from fedhmc.cli import main
from fedhmc.errors import ConfigError
from fedhmc.runtime.config import RunConfig, check_device


def _one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_cuda_index_beyond_the_machine(monkeypatch):
    _one_gpu(monkeypatch)
    check_device("cuda:0")  # there
    msg = r"--device cuda:7: this machine has 1 GPU\(s\); use cuda:0"
    with pytest.raises(ConfigError, match=msg):
        check_device("cuda:7")


def test_cuda_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    msg = "no CUDA GPU is available on this machine; use --device cpu"
    with pytest.raises(ConfigError, match=msg):
        check_device("cuda")


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "banana"])
def test_not_a_device(bad):
    with pytest.raises(ConfigError, match="--device"):
        check_device(bad)


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan"), float("inf")])
def test_client_gpus_outside_the_unit_interval(share, monkeypatch):
    _one_gpu(monkeypatch)
    with pytest.raises(ConfigError, match=r"--client-gpus must be a share of one GPU in \(0, 1\]"):
        RunConfig(backend="flower", device="cuda", client_gpus=share).validate()


def test_client_gpus_needs_flower_and_cuda(monkeypatch):
    _one_gpu(monkeypatch)
    RunConfig(backend="flower", device="cuda", client_gpus=0.25).validate()
    with pytest.raises(ConfigError, match="add --backend flower"):
        RunConfig(device="cuda", client_gpus=0.25).validate()
    with pytest.raises(ConfigError, match="add --device cuda"):
        RunConfig(backend="flower", client_gpus=0.25).validate()


def _cli(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


def test_cli_refusals_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    cases = [
        ["run", "--device", "cuda", "--out", str(out)],
        ["run", "--backend", "flower", "--client-gpus", "2", "--out", str(out)],
        ["experiment", "delayed-sgld", "--device", "cuda", "--out", str(out)],
        ["experiment", "gaussian-dim", "--device", "cuda", "--out", str(out)],
        ["experiment", "fmnist-cnn", "--device", "cuda", "--quick", "--out", str(out)],
    ]
    for argv in cases:
        code, err = _cli(argv, capsys)
        assert code == 2, argv
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
        assert not out.exists(), argv
    code, err = _cli(["experiment", "delayed-sgld", "--device", "cuda", "--out", str(out)], capsys)
    assert "run on the CPU by design" in err


def test_experiment_device_reaches_the_cells(monkeypatch):
    """``--device`` becomes the cells' device unless a cell names its own."""
    from fedhmc.sweep import cells

    seen = {}

    def fake_resume_or_replace(cfg):
        seen["device"] = cfg.device
        raise ConfigError("stop here")

    monkeypatch.setenv(cells.DEVICE_ENV, "cpu")
    monkeypatch.setattr("fedhmc.runtime.loop.resume_or_replace", fake_resume_or_replace)
    res = cells.run_cell({"dataset": "digits", "rounds": 1}, "/nonexistent/cell")
    assert res["status"] == "failed" and seen["device"] == "cpu"
    monkeypatch.setenv(cells.DEVICE_ENV, "cuda:3")
    res = cells.run_cell({"dataset": "digits", "device": "cpu"}, "/nonexistent/cell")
    assert seen["device"] == "cpu"


def test_a_device_change_keeps_a_finished_cell():
    """The device says how a cell runs, not what it computes: not part of its identity."""
    from fedhmc.sweep.cells import same_run_settings

    a = RunConfig().to_dict()
    b = {**a, "device": "cuda:0"}
    assert same_run_settings(a, b)
    assert not same_run_settings(a, {**a, "seed": 1})


def test_a_resume_on_another_device_decides_graphs_and_gpu_shares_anew(tmp_path):
    """A run started on a GPU (graphs on, a GPU share per Flower client) continues on a CPU
    without refusing its own recorded settings; given explicitly, they are kept."""
    import json

    from fedhmc.cli.options import resume_config

    saved = {**RunConfig().to_dict(), "device": "cuda:0", "cuda_graphs": True}
    saved.update(backend="flower", client_gpus=0.5)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    cfg = resume_config(str(tmp_path), {"device": "cpu"})
    assert cfg.cuda_graphs is None and cfg.client_gpus is None
    assert cfg.resolve().cuda_graphs is False
    cfg = resume_config(str(tmp_path), {"device": "cpu", "cuda_graphs": True})
    with pytest.raises(ConfigError, match="--cuda-graphs needs --device cuda"):
        cfg.resolve()


def test_mps_is_refused_for_its_missing_float64():
    with pytest.raises(ConfigError, match="float64, which Apple's MPS backend lacks"):
        check_device("mps")
