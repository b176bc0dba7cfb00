"""A run that would not fit in memory is refused in one line before its first round, and an
allocation that fails during a run ends in one line with its checkpoint kept (issue 37,
item 1). The free memory is patched where a test needs a machine of a given size, so
that no test depends on the machine it runs on."""

from __future__ import annotations

import pytest
import torch

from fedhmc.errors import ConfigError
from fedhmc.runtime.problem import MEMORY_COPIES, estimate_run_bytes

RUN = ["--dataset", "breast-cancer", "--num-clients", "3", "--local-steps", "1",
       "--leapfrog-steps", "2", "--quiet"]  # fmt: skip

SIZES = dict(
    train_values=1000 * 64,
    test_values=200 * 64,
    test_rows=200,
    num_classes=10,
    dim=5000,
    chains=4,
    clients=10,
    itemsize=4,
)


def total(**changes) -> int:
    return sum(estimate_run_bytes(**{**SIZES, **changes}))


def test_the_estimate_counts_the_data_and_the_clients_chains_and_parameters():
    host, compute = estimate_run_bytes(**SIZES)
    assert host == 4 * (2 * 64_000 + 12_800)  # float32 features, the clients' copy of theirs
    sampler = 4 * 5000 * 4 * (MEMORY_COPIES * 10 + 4)
    assert compute == 4 * (64_000 + 12_800) + sampler + 4 * 200 * 10 * 5
    # The sampler's share grows with clients × chains × D, and float64 doubles it.
    base = total(train_values=0, test_values=0, test_rows=0)
    assert total(train_values=0, test_values=0, test_rows=0, dim=10_000) == 2 * base
    assert total(train_values=0, test_values=0, test_rows=0, itemsize=8) == 2 * base
    more = total(train_values=0, test_values=0, test_rows=0, clients=20)
    assert more - base == 4 * 5000 * 4 * MEMORY_COPIES * 10
    assert total(train_values=2 * 64_000) > total()


def test_a_50_million_parameter_module_needs_tens_of_gigabytes():
    need = total(dim=50_000_000, chains=4, clients=10)
    assert need > 50e9  # 8 × 10 clients × 4 chains × 50M × 4 B = 64 GB and more
    assert total(dim=50_000_000, chains=1, clients=1) < need / 10


def test_a_run_larger_than_the_free_memory_is_refused_before_anything_is_written(
    tmp_path, cli, monkeypatch
):
    from fedhmc_datasets import memory

    monkeypatch.setattr(memory, "available_host_bytes", lambda: 10_000)
    out = tmp_path / "r"
    code, _, err = cli("run", *RUN, "--rounds", "3", "--chains", "4", "--out", out)
    assert code == 2 and "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    assert "needs about" in line and "more than the 10 kB free on this machine" in line, line
    assert "--chains" in line and "--num-clients" in line, line
    assert not out.exists()
    # With the memory it needs, the same run goes.
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 10**12)
    assert cli("run", *RUN, "--rounds", "3", "--chains", "4", "--out", out)[0] == 0


def test_an_unknown_free_memory_refuses_nothing(monkeypatch):
    from fedhmc_datasets import memory

    monkeypatch.setattr(memory, "available_host_bytes", lambda: None)
    memory.require(10**18, "cpu", "the run", "use less")


def test_the_gpu_is_checked_against_its_own_free_memory(monkeypatch):
    from fedhmc_datasets import memory

    from fedhmc import RunConfig
    from fedhmc.runtime.problem import check_run_memory

    cfg = RunConfig(dataset="gaussian-hetero", num_clients=4, dim=1000, chains=8).resolve()
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 10**12)
    monkeypatch.setattr(memory, "available_device_bytes", lambda device: 10**12)
    check_run_memory(cfg, None, 1000, "cuda:0")  # fits
    monkeypatch.setattr(memory, "available_device_bytes", lambda device: 1000)
    with pytest.raises(ConfigError, match=r"free on cuda:0; use fewer --chains \(now 8\)"):
        check_run_memory(cfg, None, 1000, "cuda:0")


@pytest.mark.parametrize(
    "exc,oom",
    [
        (MemoryError(), True),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 GB"), True),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:117] Cannot allocate memory"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_what_counts_as_an_allocation_failure(exc, oom):
    from fedhmc_datasets.memory import is_out_of_memory

    assert is_out_of_memory(exc) is oom


@pytest.mark.parametrize(
    "failure",
    [
        lambda: MemoryError(),
        lambda: RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 9 GB"),
        lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    ],
    ids=["MemoryError", "RuntimeError", "OutOfMemoryError"],
)
def test_an_allocation_failure_mid_run_is_one_line_and_keeps_the_checkpoint(
    tmp_path, cli, monkeypatch, failure
):
    from fedhmc.runtime import problem

    real = problem.PredictiveEvaluator.__call__
    calls = {"n": 0}

    def fails_in_round_3(self, theta_bar, collect):
        calls["n"] += 1
        if calls["n"] == 3:
            raise failure()
        return real(self, theta_bar, collect)

    monkeypatch.setattr(problem.PredictiveEvaluator, "__call__", fails_in_round_3)
    out = tmp_path / "r"
    code, _, err = cli("run", *RUN, "--rounds", "5", "--checkpoint-every", "1", "--out", out)
    assert code == 2 and "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    assert line.startswith("fedhmc run: error: out of memory"), line
    assert f"the checkpoint is kept: continue with fedhmc run --resume {out}" in line, line
    from fedhmc.runtime import checkpoint

    assert checkpoint.load(out)[0]["round"] == 2
    monkeypatch.setattr(problem.PredictiveEvaluator, "__call__", real)
    code, _, err = cli("run", "--resume", out, "--quiet")
    assert code == 0, err


def test_an_allocation_failure_before_the_first_round_leaves_nothing(tmp_path, cli, monkeypatch):
    from fedhmc.runtime import problem

    def no_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 9 GB")

    monkeypatch.setattr(problem, "load_client_data", no_memory)
    out = tmp_path / "r"
    code, _, err = cli("run", *RUN, "--rounds", "3", "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "out of memory" in err and "nothing was written" in err, err
    assert not out.exists()
    code, _, err = cli("data", "--dataset", "breast-cancer")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "out of memory" in err, err
