"""Checkpoints do not depend on the device: a run started on a GPU resumes on a CPU and the
other way, and continues the same chain.

No GPU is needed for the main tests. A GPU-started run is faked by editing the device that
its ``config.json`` and checkpoint record to ``cuda``; tensors "on another device" are meta
tensors whose ``.cpu()`` is patched to copy them to the CPU, so a tensor that skipped the
move would reach the file on the meta device and fail the test. Tests marked ``gpu`` run
the real thing when CUDA is present.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from fedhmc.cli.main import main
from fedhmc.errors import RunInterrupted
from fedhmc.runtime import checkpoint
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run

TIMING = {"wall_s"}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")


def rows(path: Path) -> list[dict]:
    with open(path / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(f)]


def stop_at(round_: int):
    def on_round(row):
        if row["round"] == round_:
            os.kill(os.getpid(), signal.SIGINT)

    return on_round


def tensors(obj, path="") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in nested dicts, lists and tuples, with where it sits."""
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    if isinstance(obj, dict):
        return [t for k, v in obj.items() for t in tensors(v, f"{path}/{k}")]
    if isinstance(obj, (list, tuple)):
        return [t for i, v in enumerate(obj) for t in tensors(v, f"{path}/{i}")]
    return []


def raw_payload(path: Path) -> dict:
    """A checkpoint file's payload as torch wrote it (no map location)."""
    with open(path, "rb") as f:
        f.readline()
        return torch.load(io.BytesIO(f.read()), weights_only=True)


def fake_gpu_start(run_dir: Path, device: str = "cuda") -> None:
    """Make the run in ``run_dir`` look as if it had been started with ``--device cuda``."""
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["device"] = device
    (run_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    state, _ = checkpoint.load(run_dir)
    state = {k: v for k, v in state.items() if not k.startswith("_")}
    state["config"] = {**state["config"], "device": device}
    state["device"] = checkpoint.device_name(device)
    for name in (checkpoint.NAME, checkpoint.PREVIOUS):  # only the faked one is left
        (run_dir / name).unlink(missing_ok=True)
    checkpoint.save(run_dir, state)


@pytest.fixture
def meta_is_a_gpu(monkeypatch):
    """Meta tensors play GPU tensors: ``.cpu()`` copies them (as zeros) to the CPU."""
    real = torch.Tensor.cpu

    def cpu(self, *args, **kwargs):
        if self.device.type == "meta":
            return torch.zeros(self.shape, dtype=self.dtype, device="cpu")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)


@dataclasses.dataclass
class Inner:
    anchor: torch.Tensor
    history: list


@dataclasses.dataclass
class Outer:
    position: torch.Tensor
    inner: Inner
    round: int = 0


def test_a_checkpoint_file_holds_only_cpu_tensors(tmp_path, meta_is_a_gpu):
    dev = "meta"
    state = {
        "round": 3,
        "theta_bar": torch.ones(2, 5, device=dev),
        "evaluator": {"count": 4, "log_probs": torch.zeros(7, 3, dtype=torch.float64, device=dev)},
        "backend": {
            "state": checkpoint.state_dict(
                Outer(
                    torch.ones(2, 5, device=dev),
                    Inner(torch.ones(5, device=dev), [torch.ones(1, device=dev), 2]),
                )
            ),
            "failed_rounds": 0,
            "pair": (torch.ones(2, device=dev), "x"),
        },
        "draws": [torch.ones(3, device=dev)],
        "whole_state": Outer(torch.ones(2, device=dev), Inner(torch.ones(1, device=dev), [])),
    }
    checkpoint.save(tmp_path, state)
    found = tensors(raw_payload(tmp_path / checkpoint.NAME))
    assert len(found) == 9
    assert {p: t.device.type for p, t in found} == {p: "cpu" for p, _ in found}
    # An algorithm State (nested ones included) round-trips onto a requested device.
    loaded, _ = checkpoint.load(tmp_path)
    back = checkpoint.state_from_dict(loaded["backend"]["state"], Outer, "meta")
    assert back.position.device.type == back.inner.anchor.device.type == "meta"
    assert back.inner.history[0].device.type == "meta" and back.inner.history[1] == 2
    assert checkpoint.state_from_dict(loaded["whole_state"], Outer).position.device.type == "cpu"
    moved = checkpoint.to_device(loaded["evaluator"], "meta")
    assert moved["log_probs"].device.type == "meta" and moved["log_probs"].dtype == torch.float64
    assert moved["count"] == 4


def test_a_real_runs_checkpoint_holds_only_cpu_tensors(tmp_path):
    out = tmp_path / "r"
    kw = dict(num_clients=3, rounds=4, chains=2, local_steps=2, save_samples=True, seed=3)
    run(RunConfig(**kw, algorithm="fahmc-debiased", out=str(out)), progress=False)
    payload = raw_payload(out / checkpoint.NAME)
    assert payload["device"] == "cpu"
    found = tensors(payload)
    want = {"/backend/fields/position", "/draws", "/samples", "/evaluator/log_probs"}
    assert want <= {p for p, _ in found}
    assert all(t.device.type == "cpu" for _, t in found)


def test_device_names():
    assert checkpoint.device_name("cuda") == "cuda:0"
    assert checkpoint.device_name("cuda:1") == "cuda:1"
    assert checkpoint.device_name("cpu") == checkpoint.device_name(torch.device("cpu")) == "cpu"


@pytest.mark.parametrize(
    "case",
    [
        dict(chains=3, save_samples=True),
        dict(algorithm="fahmc-debiased", chains=2, anchor_batch_size=16),
        dict(protocol="authors", local_steps=3, leapfrog_steps=4, step_size=1e-4, chains=2),
        dict(dataset="gaussian-hetero", chains=8, grad_noise=1.0),
    ],
    ids=["fahmc", "debiased", "authors", "gaussian"],
)
def test_a_run_started_on_a_gpu_resumes_on_the_cpu_with_the_same_chain(tmp_path, capsys, case):
    R = 6
    kw = {"num_clients": 3, "local_steps": 2, "leapfrog_steps": 3, "seed": 7, **case}
    full = run(RunConfig(**kw, rounds=R, out=str(tmp_path / "full")), progress=False)
    cut = tmp_path / "cut"
    with pytest.raises(RunInterrupted):
        run(RunConfig(**kw, rounds=R, out=str(cut)), progress=False, on_round=stop_at(R // 2))
    fake_gpu_start(cut)
    capsys.readouterr()
    # Without --device the saved one (cuda) is asked for: one line, nothing changed.
    before = (cut / "metrics.csv").read_text()
    assert main(["run", "--resume", str(cut), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cpu" in err[0]
    assert (cut / "metrics.csv").read_text() == before
    # With --device cpu the run continues, says so in one line, and ends where the
    # uninterrupted run ended.
    assert main(["run", "--resume", str(cut), "--device", "cpu", "--quiet"]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "resuming" in line]
    assert notes == ["fedhmc: resuming on cpu a run that was saved on cuda:0"], err
    assert rows(cut) == rows(tmp_path / "full")
    assert len(rows(cut)) == R
    assert json.loads((cut / "config.json").read_text())["device"] == "cpu"
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_round"] == R // 2
    assert summary["final"] == {
        k: v for k, v in full.summary["final"].items() if k not in ("wall_s", "grad_evals")
    }
    state, _ = checkpoint.load(cut)
    assert state["device"] == "cpu" and state["config"]["device"] == "cpu"
    assert torch.equal(state["backend"]["fields"]["position"], full.theta_bar.cpu())


def test_a_resume_on_the_same_device_says_nothing_and_other_changes_are_still_refused(
    tmp_path, capsys
):
    out = tmp_path / "r"
    kw = dict(num_clients=3, rounds=4, chains=2, seed=1)
    with pytest.raises(RunInterrupted):
        run(RunConfig(**kw, out=str(out)), progress=False, on_round=stop_at(2))
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--device", "cpu", "--quiet"]) == 0
    assert "resuming" not in capsys.readouterr().err
    code = main(["run", "--resume", str(out), "--step-size", "0.5", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--step-size" in err and "--device may change" in err


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("there,back", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_real_resume_across_devices(tmp_path, capsys, there, back):
    """Start on one device, stop at R/2, resume on the other: in float64 the chain equals
    an uninterrupted run on the CPU to 1e-10 relative (counter-based random numbers)."""
    R = 6
    kw = dict(num_clients=3, chains=2, local_steps=2, seed=4, dtype="float64", rounds=R)
    ref = run(RunConfig(**kw, out=str(tmp_path / "ref")), progress=False)
    cut = tmp_path / "cut"
    with pytest.raises(RunInterrupted):
        run(RunConfig(**kw, device=there, out=str(cut)), progress=False, on_round=stop_at(R // 2))
    found = tensors(raw_payload(cut / checkpoint.NAME))
    assert found and all(t.device.type == "cpu" for _, t in found)
    capsys.readouterr()
    result = run(RunConfig(**kw, device=back, out=str(cut), resume=True), progress=False)
    err = capsys.readouterr().err
    saved, now = checkpoint.device_name(there), checkpoint.device_name(back)
    assert [x for x in err.splitlines() if "resuming" in x] == [
        f"fedhmc: resuming on {now} a run that was saved on {saved}"
    ]
    assert result.theta_bar.device.type == torch.device(back).type
    assert torch.allclose(result.theta_bar.cpu(), ref.theta_bar, rtol=1e-10, atol=1e-12)
    assert json.loads((cut / "config.json").read_text())["device"] == back


def test_the_run_files_take_tensor_values_through_the_cpu(tmp_path, monkeypatch):
    """metrics.csv, summary.json and samples.npy convert tensors with ``.item()`` or after
    ``.cpu()``: ``numpy()`` of a GPU tensor fails, so a direct one is refused here."""
    import numpy as np

    from fedhmc.runtime.output import RunWriter

    real = torch.Tensor.numpy

    def numpy(self, *args, **kwargs):
        assert not getattr(self, "_on_gpu", False), "numpy() before .cpu()"
        return real(self, *args, **kwargs)

    class Gpu(torch.Tensor):  # a CPU tensor that calls itself a GPU one until moved
        _on_gpu = True

        def to(self, *args, **kwargs):
            return torch.Tensor.to(self.as_subclass(torch.Tensor), *args, **kwargs)

        def cpu(self, *args, **kwargs):
            return self.as_subclass(torch.Tensor).clone()

    monkeypatch.setattr(torch.Tensor, "numpy", numpy)
    w = RunWriter(tmp_path, ("accuracy", "counts"))
    w.write_row({"round": 1, "accuracy": torch.tensor(0.25), "counts": torch.tensor([1, 2])})
    w.add_sample(torch.ones(2, 3, dtype=torch.float64).as_subclass(Gpu))
    w.write_samples()
    w.write_summary({"final": {"nll": torch.tensor(2.5), "per_class": torch.tensor([1.0, 2.0])}})
    w.close()
    assert rows(tmp_path) == [
        {"round": "1", "accuracy": "0.25", "counts": "[1, 2]", "grad_evals": ""}
    ]
    assert json.loads((tmp_path / "summary.json").read_text())["final"] == {
        "nll": 2.5,
        "per_class": [1.0, 2.0],
    }
    assert np.array_equal(np.load(tmp_path / "samples.npy"), np.ones((1, 2, 3), np.float32))
