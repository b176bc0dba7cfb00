"""Errors from the user's own model code are one line (issue 37, item 1), and a module must
be a function of θ and its own example (item 4).

- A ``--model`` factory that raises, or a ``--model-arg`` that makes torch raise: exit 2,
  one line naming the exception, nothing left behind.
- A module whose forward pass fails in a later round: a one-line ``ModelError`` naming the
  module, the exception and where in the user's code it was raised (both batchings).
- A module whose output for an example depends on the other examples of its batch (batch
  norm without running statistics) is refused at the start; batch norm with running
  statistics, in eval mode, is a fixed affine map and is accepted.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from fedhmc import RunConfig, run
from fedhmc.errors import ConfigError, FedHMCError, ModelError
from fedhmc.models.loading import BATCH_RTOL
from fedhmc.models.module import TorchModel

F, C = 64, 10  # digits

USERNETS = '''
import os

import torch
from torch import nn


def missing_weights(width=8):
    raise FileNotFoundError(f"no weights at /nowhere/body-{width}.pt")


class Late(nn.Module):
    """Fails from its FAIL_AFTER-th forward pass on (a later round)."""

    calls = 0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 10)

    def forward(self, x):
        Late.calls += 1
        if Late.calls > int(os.environ.get("FAIL_AFTER", "1000000000")):
            raise IndexError("index 7 is out of bounds\\nsecond line of the message")
        return self.lin(x)
'''


def _fedhmc(*args, cwd, env=None):
    import os

    return subprocess.run(
        [sys.executable, "-m", "fedhmc", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def usernets(tmp_path, monkeypatch):
    (tmp_path / "usernets.py").write_text(USERNETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("usernets", None)
    return tmp_path


# ------------------------------------------------------------------- the factory
@pytest.mark.parametrize("backend", ["engine", "flower"])
def test_a_factory_that_raises_exits_2_in_one_line_and_writes_nothing(usernets, backend):
    p = _fedhmc(
        "run", "--model", "usernets:missing_weights", "--model-arg", "width=16",
        "--backend", backend, "--rounds", "2", "--out", "r", cwd=usernets,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    line = p.stderr.strip()
    assert "usernets:missing_weights" in line and "width=16" in line
    assert "FileNotFoundError: no weights at /nowhere/body-16.pt" in line
    assert "(at usernets.py:" in line  # where in the user's code
    assert not (usernets / "r").exists()


@pytest.mark.parametrize("backend", ["engine", "flower"])
def test_a_model_arg_that_makes_torch_raise_exits_2_in_one_line(tmp_path, backend):
    p = _fedhmc(
        "run", "--model", "torch.nn:Linear", "--model-arg", "in_features=-5",
        "--model-arg", "out_features=10", "--backend", backend, "--rounds", "2",
        "--out", "r", cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert "in_features=-5" in p.stderr and "negative dimension -5" in p.stderr
    assert not (tmp_path / "r").exists()


def test_the_factorys_error_keeps_the_original_as_its_cause():
    def factory():
        raise KeyError("body")

    with pytest.raises(ModelError) as e:
        TorchModel(factory, C, torch.randn(4, F))
    assert isinstance(e.value.__cause__, KeyError)
    assert "KeyError: 'body'" in str(e.value) and "\n" not in str(e.value)


def test_a_type_error_of_the_arguments_still_names_model_arg():
    with pytest.raises(ConfigError, match="check --model-arg"):
        TorchModel(lambda: nn.Linear(F, C), C, torch.randn(4, F), kwargs={"width": 3})


def test_an_allocation_failure_in_the_users_code_passes_through():
    """Out of memory is not the user's code's fault: it goes up as it is, for the run's own
    out-of-memory message."""

    def factory():
        raise MemoryError("cannot allocate")

    with pytest.raises(MemoryError):
        TorchModel(factory, C, torch.randn(4, F))


# ------------------------------------------------------------- a later round
class _FailsLater(nn.Module):
    """Fails from the ``after``-th forward pass on."""

    after = 0
    calls = 0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(F, C)

    def forward(self, x):
        type(self).calls += 1
        if type(self).calls > type(self).after:
            raise ValueError("my layer broke\nand a second line")
        return self.lin(x)


def _cfg(tmp_path, **kw):
    settings = dict(
        dataset="digits",
        num_clients=3,
        model=_FailsLater,
        rounds=8,
        local_steps=2,
        leapfrog_steps=2,
        chains=2,
        step_size=0.01,
        out=str(tmp_path / "r"),
    )
    return RunConfig(**{**settings, **kw})


def _calls_in_rounds(tmp_path, batching: str, rounds: int) -> int:
    """How many forward passes the module makes in building and ``rounds`` rounds."""
    _FailsLater.calls, _FailsLater.after = 0, 10**9
    run(_cfg(tmp_path / "count", model_batching=batching, rounds=rounds), progress=False)
    return _FailsLater.calls


@pytest.mark.parametrize("batching", ["vmap", "loop"])
def test_a_forward_pass_that_fails_in_a_later_round_is_one_line(tmp_path, batching):
    after = _calls_in_rounds(tmp_path, batching, 3)  # fails in round 4
    _FailsLater.calls, _FailsLater.after = 0, after
    with pytest.raises(ModelError) as e:
        run(_cfg(tmp_path, model_batching=batching), progress=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert "_FailsLater" in msg and "ValueError: my layer broke" in msg and "second" not in msg
    assert "(at test_user_module_errors.py:" in msg  # the user's line, not torch's
    assert isinstance(e.value.__cause__, ValueError)
    import json

    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_completed"] == 3


def _engine_keeps_the_checkpoint() -> bool:
    """Whether the runtime keeps the checkpoint of a run that the user's module stopped
    (fedhmc/runtime/loop.py; issue 37, item 1)."""
    import inspect

    from fedhmc.runtime import loop

    return "_kept(" in inspect.getsource(loop)


@pytest.mark.skipif(not _engine_keeps_the_checkpoint(), reason="engine without it yet")
@pytest.mark.parametrize("batching", ["vmap", "loop"])
def test_a_run_the_module_stopped_keeps_its_rounds_and_resumes_to_the_same_chain(
    tmp_path, batching
):
    """Stopped in round 4 (no checkpoint was due): the checkpoint of round 3 is written,
    the message says how to continue, and once the module works again ``--resume``
    gives the chain of a run that was never stopped."""
    after = _calls_in_rounds(tmp_path, batching, 3)
    _FailsLater.calls, _FailsLater.after = 0, 10**9
    whole = run(
        _cfg(tmp_path / "whole", model_batching=batching, save_samples=True), progress=False
    )
    _FailsLater.calls, _FailsLater.after = 0, after
    cfg = _cfg(tmp_path, model_batching=batching, save_samples=True)
    with pytest.raises(ModelError) as e:
        run(cfg, progress=False)
    msg = str(e.value)
    assert msg.startswith("round 4: ") and "\n" not in msg
    assert "the checkpoint of round 3 is kept" in msg and f"--resume {tmp_path / 'r'}" in msg
    _FailsLater.calls, _FailsLater.after = 0, 10**9  # fixed
    resumed = run(cfg.replace(resume=True), progress=False)
    assert torch.equal(resumed.theta_bar, whole.theta_bar)


def test_a_failure_while_predicting_the_test_set_is_one_line():
    model = TorchModel(_Predicts, C, torch.randn(4, F))
    theta = torch.zeros(2, model.dim)
    with pytest.raises(ModelError, match="predicting the test set.*RuntimeError: too many"):
        model.log_probs(theta, torch.randn(5000, F))


class _Predicts(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(F, C)

    def forward(self, x):
        if x.shape[0] > 1000:
            raise RuntimeError("too many examples")
        return self.lin(x)


def test_a_fedhmc_error_from_the_users_code_goes_up_as_it_is():
    class Refuses(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(F, C)
            self.refuse = False

        def forward(self, x):
            if self.refuse:
                raise FedHMCError("already one line")
            return self.lin(x)

    model = TorchModel(Refuses, C, torch.randn(4, F))
    model.net.refuse = True
    with pytest.raises(FedHMCError) as e:
        model.loss_grad(
            torch.zeros(1, model.dim),
            torch.randn(1, 3, F),
            torch.zeros(1, 3, dtype=torch.int64),
            torch.ones(1, 3),
        )
    assert type(e.value) is FedHMCError and str(e.value) == "already one line"


@pytest.mark.parametrize("batching", ["vmap", "loop"])
def test_a_later_failure_on_the_command_line_exits_2_in_one_line(usernets, batching):
    p = _fedhmc(
        "run", "--model", "usernets:Late", "--model-batching", batching, "--rounds", "6",
        "--local-steps", "2", "--quiet", "--out", "r", cwd=usernets,
        env={"FAIL_AFTER": "40" if batching == "vmap" else "800"},
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "usernets:Late" in lines[0] and "IndexError: index 7 is out of bounds" in lines[0]
    assert "(at usernets.py:" in lines[0]


# ------------------------------------------------- a function of its own example
def _flat_bn():
    return nn.Sequential(
        nn.Linear(F, 16), nn.BatchNorm1d(16, track_running_stats=False), nn.ReLU(),
        nn.Linear(16, C),
    )  # fmt: skip


class _ImageBN(nn.Module):
    """Batch norm over images without running statistics: it runs on one image (its
    statistics are over the pixels too) but gives another output within a batch."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4, track_running_stats=False)
        self.head = nn.Linear(4 * 8 * 8, C)

    def forward(self, x):
        x = x.reshape(-1, 1, 8, 8)
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


class _Mixes(nn.Module):
    """Adds ``eps`` times the batch's mean feature: a module that mixes its examples."""

    eps = 0.0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(F, C)

    def forward(self, x):
        return self.lin(x + type(self).eps * x.mean(0, keepdim=True))


@pytest.mark.parametrize("factory", [_flat_bn, _ImageBN], ids=["BatchNorm1d", "BatchNorm2d"])
def test_batch_norm_without_running_statistics_is_refused_in_one_line(tmp_path, factory):
    with pytest.raises(ConfigError) as e:
        run(RunConfig(dataset="digits", model=factory, out=str(tmp_path / "r")))
    msg = str(e.value)
    assert "each example's output from that example alone" in msg and "\n" not in msg
    assert "track_running_stats=False" in msg
    assert not (tmp_path / "r").exists()


def test_the_image_batch_norm_moves_the_logits_far_beyond_rounding():
    net = _ImageBN().eval()
    x = torch.randn(4, F)
    with torch.no_grad():
        gap = (torch.cat([net(x[i : i + 1]) for i in range(4)]) - net(x)).abs().max()
        scale = max(1.0, float(net(x).abs().max()))
    assert gap > 100 * BATCH_RTOL * scale


@pytest.mark.parametrize("eps, refused", [(1e-2, True), (1e-9, False)])
def test_the_tolerance_separates_mixing_from_float_rounding(eps, refused):
    _Mixes.eps = eps
    x = torch.randn(4, F) * 3
    if refused:
        with pytest.raises(ConfigError, match="differs from its output within a batch"):
            TorchModel(_Mixes, C, x)
    else:
        TorchModel(_Mixes, C, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_deep_float_modules_are_not_refused_for_rounding(dtype):
    """A deep float32 network's outputs differ by rounding alone between a batch and one
    example (other matmul blockings): within the tolerance."""
    torch.manual_seed(0)

    def deep():
        layers = [nn.Linear(F, 256), nn.Tanh()]
        for _ in range(6):
            layers += [nn.Linear(256, 256), nn.Tanh()]
        return nn.Sequential(*layers, nn.Linear(256, C))

    TorchModel(deep, C, torch.randn(4, F) * 5, dtype=dtype)


def test_batch_norm_with_running_statistics_is_a_fixed_affine_map(tmp_path):
    """In eval mode (the module is put there, whatever the factory returned) batch norm
    normalises with its running statistics: a fixed affine map, the same for an example
    alone and within a batch, and its buffers never change over a run."""

    def bn_net():
        net = nn.Sequential(nn.Linear(F, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, C))
        with torch.no_grad():
            net[1].running_mean.fill_(0.5)
            net[1].running_var.fill_(4.0)
        return net.train()  # returned in training mode: fedhmc evaluates it in eval mode

    model = TorchModel(bn_net, C, torch.randn(4, F))
    assert not model.net.training and not model.net[1].training
    before = {k: b.clone() for k, b in model.net.named_buffers()}
    theta = torch.randn(2, model.dim) / 4
    X, y = torch.randn(2, 6, F), torch.randint(0, C, (2, 6))
    model.loss_grad(theta, X, y, torch.ones(2, 6))
    model.log_probs(theta, X[0])
    assert all(torch.equal(b, before[k]) for k, b in model.net.named_buffers())
    bn, lin = model.net[1], model.net[0]  # the affine map: (h − 0.5) / √(4 + ε) · w + b
    h = lin(X[0])
    expected = (h - 0.5) / torch.sqrt(torch.tensor(4.0) + bn.eps) * bn.weight + bn.bias
    torch.testing.assert_close(bn(h), expected)
    result = run(
        RunConfig(dataset="digits", model=bn_net, rounds=2, out=str(tmp_path / "r")), progress=False
    )
    assert result.summary["status"] == "completed"


def test_a_module_that_drops_the_batch_dimension_for_one_example_is_refused():
    class Squeezes(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(F, C)

        def forward(self, x):
            return self.lin(x).squeeze()

    with pytest.raises(ConfigError, match=r"for a batch of 1.*no squeeze"):
        TorchModel(Squeezes, C, torch.randn(4, F))


def test_the_refusal_text_is_what_the_docs_quote():
    """docs/own-model.md quotes these checks; keep the page and the code in step."""
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "own-model.md").read_text()
    assert "track_running_stats=False" in page and "requires_grad_(False)" in page
    assert "fixed affine map" in page


def test_a_slow_factory_says_it_is_building_in_one_line(monkeypatch, capsys):
    """The line comes while the factory runs (the factory here waits for it: no timing)."""
    import threading

    from fedhmc.models import loading, module

    said = threading.Event()
    note = loading.building_note

    def noting(name):
        note(name)
        said.set()

    def slow():
        assert said.wait(10), "no line while the factory ran"
        return torch.nn.Linear(4, 3)

    monkeypatch.setattr(loading, "SLOW_BUILD_SECONDS", 0.0)
    monkeypatch.setattr(loading, "building_note", noting)
    module.TorchModel(slow, 3, torch.zeros(2, 4), name="slow:net")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fedhmc: building the model (--model slow:net) …"]
    monkeypatch.setattr(loading, "SLOW_BUILD_SECONDS", 3600.0)
    module.TorchModel(lambda: torch.nn.Linear(4, 3), 3, torch.zeros(2, 4))  # quick: silent
    assert capsys.readouterr().err == ""
