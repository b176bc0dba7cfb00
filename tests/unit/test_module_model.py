"""Any nn.Module through the generic torch.func path: the same chain as the hand-written
fast paths where the layouts agree, the same gradients on nn.Linear, and one-line refusals
of modules that cannot be sampled."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from fedhmc import RunConfig, run
from fedhmc.core import rng
from fedhmc.errors import ConfigError
from fedhmc.models.loading import format_model_args, parse_model_args
from fedhmc.models.module import TorchModel
from fedhmc.models.nets import MLP, LogisticRegression
from fedhmc.models.targets import DataTarget
from fedhmc.runtime.problem import build_problem, initial_position

F, C = 64, 10  # digits


class LogisticLayout(nn.Module):
    """Logistic regression laid out as the built-in: one W (F + 1, C) applied to [x, 1]."""

    def __init__(self, num_features: int = F, num_classes: int = C):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(num_features + 1, num_classes, device="cpu"))

    def forward(self, x):
        ones = torch.ones(*x.shape[:-1], 1, dtype=x.dtype, device=x.device)
        return torch.cat([x, ones], dim=-1) @ self.W


def mlp_layout(hidden=(16, 8)):
    """The built-in MLP's layers as an nn.Sequential (the same θ layout)."""
    widths = (F, *hidden, C)
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _base(**kw):
    settings = dict(
        dataset="digits",
        num_clients=4,
        rounds=5,
        local_steps=3,
        leapfrog_steps=4,
        chains=2,
        dtype="float64",
        init="zeros",
        step_size=0.01,
        burn_in=0,
    )
    return RunConfig(**{**settings, **kw})


def _final(cfg, tmp_path, name):
    return run(cfg.replace(out=str(tmp_path / name)), progress=False).theta_bar


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_generic_logistic_layout_gives_the_builtin_chain(tmp_path):
    ref = _final(_base(model="logistic"), tmp_path, "builtin")
    got = _final(_base(model=LogisticLayout), tmp_path, "generic")
    assert ref.shape == got.shape
    assert _rel(got, ref) < 1e-8


def test_generic_mlp_layout_gives_the_builtin_chain(tmp_path):
    ref = _final(_base(model="mlp", hidden="16,8"), tmp_path, "builtin")
    got = _final(_base(model=mlp_layout), tmp_path, "generic")
    assert _rel(got, ref) < 1e-8


@pytest.mark.parametrize("batching", ["vmap", "loop"])
def test_nn_linear_gradients_and_energies_equal_the_builtin(batching):
    torch.manual_seed(0)
    parts = [
        (
            torch.randn(n, F, dtype=torch.float64, device="cpu"),
            torch.randint(0, C, (n,), device="cpu"),
        )
        for n in (30, 50)
    ]
    builtin = DataTarget(LogisticRegression(F, C), parts, 8, 1.0, dtype=torch.float64)
    generic_model = TorchModel(
        lambda: nn.Linear(F, C), C, parts[0][0][:4], batching=batching, dtype=torch.float64
    )
    generic = DataTarget(generic_model, parts, 8, 1.0, dtype=torch.float64)
    S, N = 3, 2
    W = torch.randn(S, N, F + 1, C, dtype=torch.float64, device="cpu") * 0.1  # built-in layout
    theta_b = W.reshape(S, N, -1)
    # nn.Linear's layout: weight (C, F) row-major, then bias (C)
    theta_g = torch.cat([W[..., :F, :].transpose(-1, -2).reshape(S, N, -1), W[..., F, :]], -1)
    keys = rng.derive(7, torch.arange(S * N, device="cpu").view(S, N))
    for index in (0, 5):
        gb, eb = builtin.grad(theta_b.clone(), keys, index)
        gg, eg = generic.grad(theta_g.clone(), keys, index)
        gb = gb.view(S, N, F + 1, C)
        gb_mapped = torch.cat(
            [gb[..., :F, :].transpose(-1, -2).reshape(S, N, -1), gb[..., F, :]], -1
        )
        assert torch.allclose(eg, eb, rtol=1e-10, atol=0)
        assert float((gg - gb_mapped).abs().max() / gb_mapped.abs().max()) < 1e-10


def test_mlp_generic_gradients_match_handwritten_backprop():
    torch.manual_seed(1)
    hand = MLP(F, C, (16, 8))
    gen = TorchModel(
        lambda: mlp_layout((16, 8)), C, torch.randn(4, F, device="cpu"), dtype=torch.float64
    )
    theta = torch.randn(5, hand.dim, dtype=torch.float64, device="cpu") * 0.2
    X = torch.randn(5, 12, F, dtype=torch.float64, device="cpu")
    y = torch.randint(0, C, (5, 12), device="cpu")
    sw = torch.rand(5, 12, dtype=torch.float64, device="cpu")
    g1, v1 = hand.loss_grad(theta, X, y, sw)
    g2, v2 = gen.loss_grad(theta, X, y, sw)
    assert torch.allclose(g1, g2, rtol=1e-10, atol=1e-12)
    assert torch.allclose(v1, v2, rtol=1e-12)


def test_images_keep_their_shape_to_the_model():
    seen = []

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 3)

        def forward(self, x):
            seen.append(tuple(x.shape[1:]))
            return self.lin(x.flatten(1))

    X = torch.randn(20, 1, 4, 4, device="cpu")
    y = torch.randint(0, 3, (20,), device="cpu")
    model = TorchModel(Probe, 3, X[:4])
    target = DataTarget(model, [(X[:10], y[:10]), (X[10:], y[10:])], 4, 1.0)
    seen.clear()
    target.grad(
        torch.zeros(2, 2, model.dim, device="cpu"),
        rng.derive(0, torch.arange(4, device="cpu").view(2, 2)),
        0,
    )
    assert seen and all(s == (1, 4, 4) for s in seen)


def test_theta_is_named_parameters_in_order():
    model = TorchModel(lambda: mlp_layout((5,)), C, torch.randn(4, F, device="cpu"))
    assert [n for n, _ in model.parameter_layout()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert model.dim == 5 * F + 5 + C * 5 + C


def test_module_init_is_the_factorys_own_and_reproducible():
    cfg = _base(model=mlp_layout, init="module").resolve()
    problem = build_problem(cfg)
    a = initial_position(problem.model, problem.dim, cfg)
    b = initial_position(problem.model, problem.dim, cfg)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[1])  # one draw per chain
    w = a[0, : 16 * F].view(16, F)
    bound = 1 / F**0.5  # nn.Linear's kaiming-uniform bound
    assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.9 * bound
    auto = initial_position(problem.model, problem.dim, cfg.replace(init="auto"))
    assert torch.equal(auto, a)  # a module starts from its own initialisation by default


def test_model_args_round_trip():
    kw = parse_model_args("channels=16;scale=0.5;name=wide;shape=(1, 28, 28)")
    assert kw == {"channels": 16, "scale": 0.5, "name": "wide", "shape": (1, 28, 28)}
    assert parse_model_args(format_model_args(kw)) == kw


class _Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(F, C)
        self.register_buffer("calls", torch.zeros((), device="cpu"))

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


class _Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(F, C)

    def forward(self, x):
        return self.lin(x) + torch.randn(x.shape[0], C, device=x.device)


def _not_a_module():
    return 3


def _wrong_classes():
    return nn.Linear(F, C + 1)


@pytest.mark.parametrize(
    "factory, words",
    [
        (_Counter, "changes the buffer"),
        (_Noisy, "deterministic"),
        (_not_a_module, "not a torch.nn.Module"),
        (_wrong_classes, "last dimension must be the 10 classes"),
    ],
)
def test_unsampleable_modules_are_refused_in_one_line(factory, words, tmp_path):
    with pytest.raises(ConfigError) as e:
        run(_base(model=factory, out=str(tmp_path / "r")), progress=False)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "spec, words",
    [
        ("nosuchpackage.nets:make", "cannot import 'nosuchpackage.nets'"),
        ("torch.nn:NoSuchLayer", "has no attribute 'NoSuchLayer'"),
        ("linear", "PACKAGE.MODULE:FACTORY"),
    ],
)
def test_bad_model_specs_exit_2_and_write_nothing(spec, words, tmp_path):
    out = tmp_path / "r"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedhmc",
            "run",
            "--model",
            spec,
            "--rounds",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2
    assert words in p.stderr and p.stderr.count("\n") == 1
    assert not out.exists()


def test_cli_spec_and_model_args_are_recorded(tmp_path):
    mod = tmp_path / "mynets.py"
    mod.write_text(
        "import torch.nn as nn\n"
        "def make(width=8):\n"
        "    return nn.Sequential(nn.Linear(64, width), nn.Tanh(), nn.Linear(width, 10))\n"
    )
    out = tmp_path / "r"
    p = subprocess.run(
        [
            sys.executable, "-m", "fedhmc", "run", "--model", "mynets:make",
            "--model-arg", "width=6", "--rounds", "2", "--local-steps", "2", "--quiet",
            "--out", str(out),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"] == "mynets:make" and cfg["model_arg"] == "width=6"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dim"] == 64 * 6 + 6 + 6 * 10 + 10
    assert [p[0] for p in summary["model_parameters"]] == [
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    ]


def test_arviz_names_a_modules_parameters_after_the_module(tmp_path):
    pytest.importorskip("arviz")
    from fedhmc.runtime.export import to_inference_data

    cfg = _base(model=lambda: mlp_layout((5,)), rounds=4, chains=2, save_samples=True)
    run(cfg.replace(out=str(tmp_path / "r")), progress=False)
    idata = to_inference_data(tmp_path / "r")
    post = idata.posterior
    assert set(post.data_vars) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert post["0.weight"].shape[2:] == (5, F) and post["2.bias"].shape[2:] == (C,)
    draws = np.load(tmp_path / "r" / "samples.npy")  # (draws, chains, D), θ's order
    np.testing.assert_allclose(
        post["2.weight"].values[1, -1], draws[-1, 1, 5 * F + 5 : 5 * F + 5 + C * 5].reshape(C, 5)
    )


def test_every_model_satisfies_the_model_protocol():
    from fedhmc.models.protocols import Model

    for model in (
        LogisticRegression(F, C),
        MLP(F, C, (4,)),
        TorchModel(lambda: nn.Linear(F, C), C, torch.randn(2, F, device="cpu")),
    ):
        assert isinstance(model, Model)


def test_a_module_instance_starts_every_chain_at_its_own_weights(tmp_path):
    torch.manual_seed(5)
    trained = mlp_layout((4,))
    cfg = _base(model=trained, init=None).resolve()
    problem = build_problem(cfg)
    theta = initial_position(problem.model, problem.dim, cfg)
    want = torch.cat([p.detach().reshape(-1) for p in trained.parameters()]).double()
    assert torch.equal(theta[0], want) and torch.equal(theta[1], want)
    redrawn = initial_position(problem.model, problem.dim, cfg.replace(init="module"))
    assert not torch.equal(redrawn[0], want) and not torch.equal(redrawn[0], redrawn[1])


def test_model_batching_is_an_option_and_both_give_the_same_chain(tmp_path):
    a = _final(_base(model=mlp_layout, model_batching="vmap"), tmp_path, "v")
    b = _final(_base(model=mlp_layout, model_batching="loop"), tmp_path, "l")
    assert _rel(a, b) < 1e-10


class _Tied(nn.Module):
    """Two layers sharing one weight (tied), then a head: θ holds the shared weight once."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(F, 16)
        self.b = nn.Linear(F, 16)
        self.b.weight = self.a.weight
        self.head = nn.Linear(16, C)

    def forward(self, x):
        return self.head(torch.tanh(self.a(x)) * torch.sigmoid(self.b(x)))


def _reference(model, theta, X, y, sw):
    """What TorchModel computed before its binding was built once: ``torch.func.vmap`` of
    ``functional_call`` on θ's views made at every call and one reverse pass (or, for the
    loop, a forward and a reverse pass of each row); and the log-probabilities of every
    row's θ on ``X`` flattened to one set of examples. (Both with the linear layers'
    products laid out classes first, as TorchModel runs them.)"""
    from torch.func import functional_call, vmap

    from fedhmc.models.module import ClassesFirstLinear, _classes_axis

    def logits(row, x):
        with ClassesFirstLinear():
            return functional_call(model.net, model.unflatten(row), (x,))

    def loss_grad(theta, X, y, sw, forward):
        with torch.enable_grad():
            th = theta.detach().requires_grad_(True)
            out = forward(th, X)
            z, c = _classes_axis(out)  # the softmax's axis in memory, as TorchModel takes it
            logp = torch.log_softmax(z, dim=c)
            nll = -(logp.gather(c, y.unsqueeze(c)).squeeze(c) * sw).sum(-1)
            (g,) = torch.autograd.grad(nll.sum(), th)
        return g, nll.detach()

    if model.batching == "vmap":
        g, nll = loss_grad(theta, X, y, sw, vmap(logits))
    else:
        rows = [loss_grad(*r, logits) for r in zip(theta, X, y, sw, strict=True)]
        g, nll = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
    Xs = X.reshape(-1, *X.shape[2:])
    with torch.no_grad():
        if model.batching == "vmap":
            out = vmap(logits, in_dims=(0, None))(theta, Xs)
        else:
            out = torch.stack([logits(t, Xs) for t in theta])
        z, c = _classes_axis(out)  # the softmax's axis in memory, as TorchModel takes it
        logp = torch.log_softmax(z, dim=c)
    return g, nll.detach(), Xs, logp if c == -1 else logp.mT


def _devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("batching", ["vmap", "loop"])
@pytest.mark.parametrize("factory", [lambda: mlp_layout((16, 8)), _Tied], ids=["mlp", "tied"])
def test_the_bound_path_equals_functional_call_bit_for_bit_at_every_shape(
    factory, batching, direct, device, monkeypatch
):
    """The binding, θ's views and the batched function are built once: calls at changing
    numbers of rows and batch sizes, repeated, give exactly functional_call's numbers, and
    leave the module's own parameters in place."""
    import fedhmc.models.torch_private as private

    if direct and not private.DIRECT_VMAP:
        pytest.skip("this torch lacks vmap's primitives: only the public vmap path runs")
    monkeypatch.setattr(private, "DIRECT_VMAP", direct)
    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(3)
    ex = torch.randn(4, F, generator=gen, dtype=torch.float64, device="cpu").to(dev)
    model = TorchModel(factory, C, ex, batching=batching, dtype=torch.float64, device=dev)
    own = {k: p for k, p in model.net.named_parameters()}
    for M, B in [(3, 5), (7, 16), (1, 1), (3, 5), (7, 16)]:
        theta = torch.randn(M, model.dim, generator=gen, dtype=torch.float64, device="cpu") * 0.3
        X = torch.randn(M, B, F, generator=gen, dtype=torch.float64, device="cpu")
        y = torch.randint(0, C, (M, B), generator=gen, device="cpu")
        sw = torch.rand(M, B, generator=gen, dtype=torch.float64, device="cpu")
        theta, X, y, sw = (t.to(dev) for t in (theta, X, y, sw))
        g_ref, v_ref, Xs, lp_ref = _reference(model, theta, X, y, sw)
        for _ in range(2):
            g, v = model.loss_grad(theta, X, y, sw)
            assert torch.equal(g, g_ref) and torch.equal(v, v_ref)
            assert g.device == dev and g.shape == (M, model.dim)
            assert torch.equal(model.log_probs(theta, Xs), lp_ref)
        g_only, none = model.loss_grad(theta, X, y, sw, need_value=False)
        assert none is None and torch.equal(g_only, g_ref)
    assert {k: p for k, p in model.net.named_parameters()} == own  # the same Parameters
    assert all(type(p) is nn.Parameter for p in model.net.parameters())


@pytest.mark.parametrize("direct", [True, False])
def test_a_pickled_or_copied_model_binds_its_own_module(direct, monkeypatch):
    import copy
    import pickle

    import fedhmc.models.torch_private as private

    monkeypatch.setattr(private, "DIRECT_VMAP", direct and private.DIRECT_VMAP)
    model = TorchModel(_Tied, C, torch.randn(4, F, device="cpu"))
    theta = torch.randn(3, model.dim, device="cpu")
    X = torch.randn(3, 5, F, device="cpu")
    y = torch.randint(0, C, (3, 5), device="cpu")
    sw = torch.rand(3, 5, device="cpu")
    g, v = model.loss_grad(theta, X, y, sw)
    for other in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        own = {id(m) for m in other.net.modules()}
        assert all(id(owner) in own for owner, _, _ in other._bound.slots)  # not model's module
        g2, v2 = other.loss_grad(theta, X, y, sw)
        assert torch.equal(g2, g) and torch.equal(v2, v)


def test_a_failing_forward_leaves_the_module_as_it_was():
    class Fails(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(F, C)
            self.fail = False

        def forward(self, x):
            out = self.lin(x)
            if self.fail:
                raise RuntimeError("boom")
            return out

    model = TorchModel(Fails, C, torch.randn(4, F, device="cpu"))
    weight = model.net.lin.weight
    model.net.fail = True
    theta = torch.zeros(2, model.dim, device="cpu")
    X = torch.randn(2, 3, F, device="cpu")
    y = torch.zeros(2, 3, dtype=torch.int64, device="cpu")
    with pytest.raises(RuntimeError, match="boom"):
        model.loss_grad(theta, X, y, torch.ones(2, 3, device="cpu"))
    assert model.net.lin.weight is weight
    model.net.fail = False  # and the batching level was left: the next call works
    g, _ = model.loss_grad(theta, X, y, torch.ones(2, 3, device="cpu"))
    assert g.shape == (2, model.dim)


# ------------------------------------------------------------ linear layers, classes first


def _as_written(model, theta, X, y, sw):
    """The module's gradient and energy as written (no ClassesFirstLinear): functional_call,
    vmap and autograd through the whole loss."""
    from torch.func import functional_call, vmap

    with torch.enable_grad():
        th = theta.detach().requires_grad_(True)
        out = vmap(lambda r, x: functional_call(model.net, model.unflatten(r), (x,)))(th, X)
        logp = torch.log_softmax(out, dim=-1)
        nll = -(logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) * sw).sum(-1)
        (g,) = torch.autograd.grad(nll.sum(), th)
    return g, nll.detach()


def _rows(M, B, dim, seed=5):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    theta = torch.randn(M, dim, generator=gen, dtype=torch.float64, device="cpu") * 0.3
    X = torch.randn(M, B, F, generator=gen, dtype=torch.float64, device="cpu")
    y = torch.randint(0, C, (M, B), generator=gen, device="cpu")
    sw = torch.rand(M, B, generator=gen, dtype=torch.float64, device="cpu")
    return theta, X, y, sw


class _FlattensItsOutput(nn.Module):
    """Valid as written, but ``.view(-1)`` of a linear layer's output needs it laid out
    row-major; with ``late``, only on batches of more than 4 (the check's batch is 4)."""

    def __init__(self, late: bool = False):
        super().__init__()
        self.fc = nn.Linear(F, C)
        self.late = late

    def forward(self, x):
        h = self.fc(x)
        if not self.late or x.shape[0] > 4:
            return h.view(-1).view(x.shape[0], C)
        return h


@pytest.mark.parametrize(
    "factory",
    [lambda: nn.Linear(F, C), lambda: mlp_layout((16, 8)), LogisticLayout],
    ids=["nn.Linear", "mlp", "x@W"],
)
@pytest.mark.parametrize("batching", ["vmap", "loop"])
def test_linear_layers_run_classes_first_with_the_gradients_as_written(factory, batching):
    """nn.Linear and a (B, F) @ (F, C) product run laid out classes first (the reverse pass's
    products "short × long"), and give the module's gradients as written up to float
    rounding."""
    from fedhmc.models.module import ClassesFirstLinear

    model = TorchModel(
        factory, C, torch.randn(4, F, device="cpu"), batching=batching, dtype=torch.float64
    )
    assert model.classes_first
    theta, X, y, sw = _rows(3, 20, model.dim)
    g, v = model.loss_grad(theta, X, y, sw)
    g_ref, v_ref = _as_written(model, theta, X, y, sw)
    assert float((g - g_ref).abs().max()) <= 1e-12 * float(g_ref.abs().max())
    assert torch.allclose(v, v_ref, rtol=1e-13, atol=0)
    with ClassesFirstLinear():  # the mode itself: outputs first in memory
        out = model.net(X[0])
    assert out.shape == (20, C) and out.mT.is_contiguous() and not out.is_contiguous()


def test_a_module_that_needs_its_layout_runs_as_written(capsys):
    model = TorchModel(_FlattensItsOutput, C, torch.randn(4, F, device="cpu"), dtype=torch.float64)
    assert not model.classes_first  # decided on the check's batch, once, without a word
    assert capsys.readouterr().err == ""
    theta, X, y, sw = _rows(3, 20, model.dim)
    g, v = model.loss_grad(theta, X, y, sw)
    g_ref, v_ref = _as_written(model, theta, X, y, sw)
    assert torch.equal(g, g_ref) and torch.equal(v, v_ref)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_layout_failure_in_the_run_runs_that_call_as_written_in_one_line(compiled, capsys):
    model = TorchModel(
        lambda: _FlattensItsOutput(late=True),
        C,
        torch.randn(4, F, device="cpu"),
        dtype=torch.float64,
        compile=compiled,
    )
    assert model.classes_first and model.compiled == compiled  # the check's 4 do not flatten
    theta, X, y, sw = _rows(3, 20, model.dim)
    g, v = model.loss_grad(theta, X, y, sw)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "as written on inputs of shape (20, 64)" in err[0], err
    g_ref, v_ref = _as_written(model, theta, X, y, sw)
    tol = 1e-12 if compiled else 0.0  # (compiled: another order of the same sums)
    assert float((g - g_ref).abs().max()) <= tol * float(g_ref.abs().max())
    assert torch.allclose(v, v_ref, rtol=tol, atol=0)
    g2, _ = model.loss_grad(theta, X, y, sw)  # that shape as written again, silently
    assert torch.equal(g2, g) and capsys.readouterr().err == ""
    assert model.classes_first and model.compiled == compiled  # the strategy never changes
    # Which way a call runs depends on its own shape alone, never on the calls before it:
    # a fresh model calling the shapes in the other order gives the same numbers.
    small = _rows(2, 3, model.dim, seed=6)
    g_small, _ = model.loss_grad(*small)
    fresh = TorchModel(
        lambda: _FlattensItsOutput(late=True),
        C,
        torch.randn(4, F, device="cpu"),
        dtype=torch.float64,
        compile=compiled,
    )
    g_first, _ = fresh.loss_grad(*small)
    assert torch.equal(g_first, g_small)
    assert torch.equal(fresh.loss_grad(theta, X, y, sw)[0], g)
    capsys.readouterr()


def test_run_sends_a_flower_config_to_flower(tmp_path, monkeypatch):
    import fedhmc_server.simulation as sim

    from fedhmc.runner import run_config

    seen = {}
    monkeypatch.setattr(sim, "run_flower", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    run_config(_base(backend="flower", out=str(tmp_path / "f")), progress=False)
    assert seen["cfg"].backend == "flower"
