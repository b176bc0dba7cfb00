"""Each private torch API of ``fedhmc.models.torch_private`` against its public fallback, on
small inputs: the test fails when the two differ (bit for bit where the module promises
it, else beyond float rounding), so that a torch whose internals changed is caught here
before a chain depends on it.

Each test runs the fast path where this torch has it and skips only that side otherwise;
the fallback always runs.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhmc.models import torch_private as private

F, C = 6, 3


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _Tied(nn.Module):
    """Two layers sharing a weight, and a frozen parameter."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(F, F)
        self.b = nn.Linear(F, F)
        self.b.weight = self.a.weight
        self.head = nn.Linear(F, C)
        self.shift = nn.Parameter(torch.linspace(-1, 1, F), requires_grad=False)

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x + self.shift)))))


def _values(bound: private.BoundModule, lead: tuple[int, ...], seed: int = 1):
    gen = _gen(seed)
    sampled = dict(bound.net.named_parameters())
    return [torch.randn(*lead, *sampled[k].shape, generator=gen) for k in bound.names]


def test_the_swapped_parameters_are_functional_calls_bit_for_bit():
    net = _Tied().eval()
    bound = private.BoundModule(net)
    assert bound.names == ["a.weight", "a.bias", "b.bias", "head.weight", "head.bias"]
    assert [(attr, i) for _, attr, i in bound.slots] == [
        ("weight", 0), ("bias", 1), ("weight", 0), ("bias", 2), ("weight", 3), ("bias", 4)
    ]  # fmt: skip
    values = _values(bound, ())
    x = torch.randn(5, F, generator=_gen(2))
    own = dict(net.named_parameters())
    fast = bound.swapped(values, x)
    public = bound.functional(values, x)
    assert torch.equal(fast, public)
    assert dict(net.named_parameters()) == own  # put back
    with pytest.raises(AssertionError):  # (the comparison can fail: other values differ)
        assert torch.equal(bound.swapped(_values(bound, (), seed=3), x), public)


@pytest.mark.parametrize("batched", [True, False], ids=["own inputs", "shared inputs"])
def test_one_vmap_level_is_torch_func_vmap_bit_for_bit(batched):
    if not private.DIRECT_VMAP:
        pytest.skip("this torch lacks vmap's primitives: only torch.func.vmap runs")
    private.prepare_vmap()
    bound = private.BoundModule(_Tied().eval())
    rows = _values(bound, (4,))
    x = torch.randn(*((4,) if batched else ()), 5, F, generator=_gen(4))
    fast = private.direct_vmap_call(lambda *a: bound.swapped(a[:-1], a[-1]), rows, x, batched)
    public = private.public_vmap_call(lambda *a: bound.functional(a[:-1], a[-1]), rows, x, batched)
    assert fast.shape == (4, 5, C)
    assert torch.equal(fast, public)


def test_one_vmap_level_refuses_an_output_that_is_not_a_tensor():
    if not private.DIRECT_VMAP:
        pytest.skip("this torch lacks vmap's primitives")
    rows = [torch.zeros(2, 3)]
    with pytest.raises(ValueError, match="returned a tuple, not a tensor"):
        private.direct_vmap_call(lambda t, x: (t, x), rows, torch.zeros(2, 3), True)
    # the level was left: the next call works
    out = private.direct_vmap_call(lambda t, x: t + x, rows, torch.ones(3), False)
    assert torch.equal(out, torch.ones(2, 3))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-15), (torch.float32, 1e-6)])
@pytest.mark.parametrize("dim", [-1, -2])
def test_log_softmax_backward_is_its_formula(dtype, tol, dim):
    gen = _gen(5)
    logits = torch.randn(3, 7, 4, generator=gen, dtype=dtype) * 3
    logp = torch.log_softmax(logits, dim=dim)
    g = torch.randn(logp.shape, generator=gen, dtype=dtype)
    public = private.public_log_softmax_backward(g, logp, dim)
    # autograd's own reverse pass of log_softmax: the numbers both must give
    x = logits.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(torch.log_softmax(x, dim=dim), x, g)
    torch.testing.assert_close(public, want, rtol=tol, atol=tol)
    if private.LOG_SOFTMAX_BACKWARD_AVAILABLE:
        fast = private.log_softmax_backward(g, logp, dim)
        assert torch.equal(fast, want)  # the kernel autograd calls
        torch.testing.assert_close(fast, public, rtol=tol, atol=tol)


def test_the_convolutions_are_the_public_classes():
    convs = [nn.Conv1d(1, 2, 3), nn.Conv2d(1, 2, 3), nn.Conv3d(1, 2, 3), nn.LazyConv2d(2, 3)]
    convs += [nn.ConvTranspose1d(1, 2, 3), nn.ConvTranspose2d(1, 2, 3), nn.ConvTranspose3d(1, 2, 3)]
    others = [nn.Linear(2, 2), nn.Sequential(nn.Conv2d(1, 2, 3)), nn.MaxPool2d(2), nn.Flatten()]
    for m in convs:
        assert private.is_convolution(m) and isinstance(m, private.CONVOLUTIONS), m
    for m in others:
        assert not private.is_convolution(m) and not isinstance(m, private.CONVOLUTIONS), m


def _row_grads(net: nn.Module):
    """vmap(grad_and_value) of one row's loss over (theta, X, y, sw): what TorchModel
    compiles."""
    bound = private.BoundModule(net)
    shapes = [p.shape for k, p in net.named_parameters() if p.requires_grad]
    sizes = [s.numel() for s in shapes]

    def loss(theta, x, y, sw):
        parts = [p.reshape(s) for p, s in zip(theta.split(sizes), shapes, strict=True)]
        logp = torch.log_softmax(bound.functional(parts, x), dim=-1)
        return -(logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) * sw).sum()

    return torch.func.vmap(torch.func.grad_and_value(loss)), sum(sizes)


def test_the_compiled_function_is_torch_compiles_up_to_rounding():
    net = nn.Sequential(nn.Linear(F, 5), nn.Tanh(), nn.Linear(5, C)).eval()
    fn, dim = _row_grads(net)
    gen = _gen(6)
    inputs = (
        torch.randn(2, dim, generator=gen, dtype=torch.float64),
        torch.randn(2, 4, F, generator=gen, dtype=torch.float64),
        torch.randint(0, C, (2, 4), generator=gen),
        torch.rand(2, 4, generator=gen, dtype=torch.float64),
    )
    eager = fn(*inputs)
    public = private.compile_public(fn, inputs)(*inputs)
    fast = private.compile_traced(fn, inputs)(*inputs)
    for got in (public, fast):
        torch.testing.assert_close(got[0], eager[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got[1], eager[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fast[0], public[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("batching", ["vmap", "loop"])
def test_a_model_on_the_fallbacks_alone_gives_the_fast_paths_numbers(batching, monkeypatch):
    """TorchModel with every fast path off (what a torch without them runs): the same
    gradients, energies and predictions, up to float rounding (log_softmax's backward sums
    in another order; the rest is bit for bit)."""
    from fedhmc.models.module import TorchModel

    gen = _gen(7)
    ex = torch.randn(4, F, generator=gen, dtype=torch.float64)
    fast = TorchModel(_Tied, C, ex, batching=batching, dtype=torch.float64)
    for flag in ("DIRECT_VMAP", "DIRECT_SWAP", "LOG_SOFTMAX_BACKWARD_AVAILABLE"):
        monkeypatch.setattr(private, flag, False)
    slow = TorchModel(_Tied, C, ex, batching=batching, dtype=torch.float64)
    theta = torch.randn(3, fast.dim, generator=gen, dtype=torch.float64)
    X = torch.randn(3, 5, F, generator=gen, dtype=torch.float64)
    y = torch.randint(0, C, (3, 5), generator=gen)
    sw = torch.rand(3, 5, generator=gen, dtype=torch.float64)
    g0, v0 = fast.loss_grad(theta, X, y, sw)
    g1, v1 = slow.loss_grad(theta, X, y, sw)
    torch.testing.assert_close(g1, g0, rtol=1e-13, atol=1e-13)
    assert torch.equal(v1, v0)  # (the energy does not go through the backward)
    assert torch.equal(slow.log_probs(theta, X[0]), fast.log_probs(theta, X[0]))
