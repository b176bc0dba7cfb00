"""The same bits in every run on the device under test (``pytest -m gpu``).

A GPU may add in a different order from one run to the next: atomic additions (ECE's bins
once were) and cuDNN algorithms chosen by autotuning or nondeterministic by design (the
CNN's backward pass under ``vmap``). fedhmc sums ECE's bins on the CPU and makes a CUDA run
choose cuDNN's deterministic algorithms (`fedhmc.core.determinism`); these tests check
that on the device: ECE, a CNN's client gradients and two whole runs, twice over.
"""

from __future__ import annotations

import pytest
import torch
from gpu_cells import CELLS_F64, Comparison, config

from fedhmc.core.graphs import RoundGraphs

pytestmark = pytest.mark.gpu


def test_ece_is_the_same_in_every_run_and_on_every_device(device64):
    from fedhmc.analysis.metrics import ece

    gen = torch.Generator().manual_seed(1)
    probs = torch.softmax(2 * torch.randn(20_000, 10, generator=gen, dtype=torch.float64), -1)
    labels = torch.randint(0, 10, (20_000,), generator=gen)
    want = ece(probs, labels)
    got = [ece(probs.to(device64), labels.to(device64)) for _ in range(5)]
    assert got == [want] * 5


def test_a_cnns_client_gradients_are_the_same_every_time(device):
    """LeNet-5 on 4 clients' minibatches, its gradient (grouped convolutions under
    ``vmap``, forward and backward) evaluated three times: the same bits each time."""
    from fedhmc.algorithms import fahmc
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.problem import build_problem

    cfg = RunConfig(
        dataset="digits", model="cnn", num_clients=4, batch_size=16, chains=2,
        device=str(device), dtype="float32",
    ).resolve()  # fmt: skip
    target = build_problem(cfg, device).target
    gen = torch.Generator().manual_seed(0)
    theta = 0.1 * torch.randn(2, 4, target.dim, generator=gen).to(device)
    keys = fahmc.data_keys(torch.arange(4, device=device), torch.arange(2, device=device))
    first, energy = target.grad(theta.clone(), keys, 0)
    for _ in range(2):
        g, e = target.grad(theta.clone(), keys, 0)
        assert torch.equal(g, first) and torch.equal(e, energy)
    if device.type == "cuda":
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


TWICE = [c for c in CELLS_F64 if c.id in {"fahmc-logistic", "fahmc-cnn"}]


@pytest.mark.parametrize("cell", TWICE, ids=[c.id for c in TWICE])
def test_two_runs_are_the_same_bit_for_bit(cell, device64, tmp_path):
    from fedhmc.runtime.engine import run

    a = run(config(cell, device64, tmp_path / "a"), progress=False)
    b = run(config(cell, device64, tmp_path / "b"), progress=False)
    cmp = Comparison()
    cmp.exact("theta_bar", a.theta_bar.cpu(), b.theta_bar.cpu())
    for x, y in zip(a.history, b.history, strict=True):
        for k in ("accuracy", "brier", "ece", "nll_mean", "nll_sum"):
            cmp.exact(f"round {x['round']} {k}", x[k], y[k])
    cmp.assert_ok()


def test_graphs_capture_and_replay_on_a_device_that_is_not_current(device64):
    """Graphs on cuda:1 while cuda:0 is current (the device a run names is made current
    for warm-up, capture and replay): replayed rounds, equal to the eager ones."""
    if device64.type != "cuda" or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    other = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    graphs = RoundGraphs(device=other)
    x = torch.linspace(0, 1, 1000, device=other, dtype=torch.float64)
    for k in range(5):
        assert torch.equal(graphs("k", lambda t: (t.sin() * 2 + 1,), (x + k,))[0],
                           (x + k).sin() * 2 + 1)  # fmt: skip
    assert graphs.off is None and graphs.replays == 3


def test_a_graph_records_kernels(device64):
    """A capture on the device under test records its kernels (no "CUDA Graph is empty"),
    and its replays follow new inputs."""
    if device64.type != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    graphs = RoundGraphs(device=device64)
    x = torch.linspace(0, 1, 1000, device=device64, dtype=torch.float64)
    for k in range(5):
        assert torch.equal(graphs("k", lambda t: (t.exp() - 1,), (x * k,))[0], (x * k).exp() - 1)
    assert graphs.off is None and graphs.replays == 3
