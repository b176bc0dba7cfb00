"""Client energies and their gradients: closed forms against autograd, scaling, minibatches."""

import math

import pytest
import torch

from fedhmc.algorithms import fahmc
from fedhmc.algorithms.fahmc import (
    client_seed,
    client_update,
    round_seed,
)
from fedhmc.core import rng
from fedhmc.models.nets import MLP, LogisticRegression
from fedhmc.models.targets import DataTarget, hetero_gaussian


def make_parts(sizes, features=5, classes=3, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(n, features, generator=gen, dtype=dtype),
            torch.randint(0, classes, (n,), generator=gen),
        )
        for n in sizes
    ]


def full_posterior_energy(model, parts, theta, prior_std):
    """−log posterior on the pooled data, by autograd: Σ_i ℓ_i + ‖θ‖²/(2σ₀²)."""
    X = torch.cat([p[0] for p in parts])
    y = torch.cat([p[1] for p in parts])
    lp = model.log_probs(theta.unsqueeze(0), model.prepare(X))[0]
    return -lp.gather(1, y.view(-1, 1)).sum() + theta.square().sum() / (2 * prior_std**2)


@pytest.mark.parametrize("model_name", ["logistic", "mlp"])
def test_weighted_client_energies_sum_to_the_full_posterior(model_name):
    parts = make_parts([7, 20, 13])
    model = LogisticRegression(5, 3) if model_name == "logistic" else MLP(5, 3, (4, 6))
    target = DataTarget(model, parts, batch_size=0, prior_std=1.5, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    theta = torch.randn(model.dim, dtype=torch.float64, generator=gen)
    g, e = target.grad(theta.view(1, 1, -1).expand(1, 3, -1).clone(), None, 0)
    w = target.weights
    theta_req = theta.clone().requires_grad_(True)
    f = full_posterior_energy(model, parts, theta_req, 1.5)
    (g_ref,) = torch.autograd.grad(f, theta_req)
    torch.testing.assert_close((w.view(1, 3, 1) * g).sum(1)[0], g_ref)
    torch.testing.assert_close((w.view(1, 3) * e).sum(1)[0], f.detach())
    # Each client's energy is its own data scaled by n / n_c, plus the whole prior.
    n = sum(len(p[1]) for p in parts)
    for c, (Xc, yc) in enumerate(parts):
        lp = model.log_probs(theta.view(1, -1), model.prepare(Xc))[0]
        local = -(n / len(yc)) * lp.gather(1, yc.view(-1, 1)).sum() + theta.square().sum() / 4.5
        torch.testing.assert_close(e[0, c], local)


def test_minibatch_gradient_is_unbiased():
    parts = make_parts([30, 12], features=3, classes=2)
    model = LogisticRegression(3, 2)
    full = DataTarget(model, parts, batch_size=0, prior_std=2.0, dtype=torch.float64)
    mini = DataTarget(model, parts, batch_size=5, prior_std=2.0, dtype=torch.float64)
    theta = torch.linspace(-1, 1, model.dim, dtype=torch.float64).view(1, 1, -1).expand(1, 2, -1)
    g_full, _ = full.grad(theta, None, 0)
    reps = 4000
    keys = rng.derive(0, torch.arange(reps).view(reps, 1), torch.arange(2).view(1, 2))
    g_mini, _ = mini.grad(theta.expand(reps, 2, -1), keys, 0)
    mean = g_mini.mean(0)
    se = g_mini.std(0) / math.sqrt(reps)
    assert torch.all((mean - g_full[0]).abs() <= 5 * se + 1e-9)
    # Different counters draw different minibatches; the same counter the same one.
    a, _ = mini.grad(theta, keys[:1], 3)
    b, _ = mini.grad(theta, keys[:1], 3)
    c, _ = mini.grad(theta, keys[:1], 4)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_client_smaller_than_batch_uses_its_full_data():
    parts = make_parts([3, 40], features=2, classes=2)
    model = LogisticRegression(2, 2)
    mini = DataTarget(model, parts, batch_size=8, prior_std=1.0, dtype=torch.float64)
    full = DataTarget(model, parts, batch_size=0, prior_std=1.0, dtype=torch.float64)
    theta = torch.ones(1, 2, model.dim, dtype=torch.float64)
    keys = rng.derive(1, torch.arange(2).view(1, 2))
    g_mini, _ = mini.grad(theta, keys, 0)
    g_full, _ = full.grad(theta, keys, 0)
    torch.testing.assert_close(g_mini[0, 0], g_full[0, 0])


@pytest.mark.parametrize("rho", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("model_name", ["logistic", "mlp"])
def test_single_client_updates_equal_the_batched_engine(rho, model_name):
    parts = make_parts([9, 25, 16, 4], features=4, classes=3, dtype=torch.float32)
    model = LogisticRegression(4, 3) if model_name == "logistic" else MLP(4, 3, (5,))
    target = DataTarget(model, parts, batch_size=6, prior_std=1.0)
    s = fahmc.Settings(0.05, 3, 4, rho=rho, grad_noise=0.5, temperature=0.8)
    gen = torch.Generator().manual_seed(3)
    theta_bar = 0.1 * torch.randn(2, model.dim, generator=gen)
    seed = 11
    for r in (1, 2):
        state, _ = fahmc.step(seed, fahmc.State(theta_bar, r - 1), target, s)
        batched = state.position
        message = fahmc.Broadcast(r, round_seed(seed, r), theta_bar)
        ones = [
            client_update(
                message, target.client(c), s, torch.tensor([client_seed(seed, c)])
            ).position[:, 0]
            for c in range(4)
        ]
        avg = sum(target.weights[c].float() * ones[c] for c in range(4))
        torch.testing.assert_close(avg, batched, rtol=1e-5, atol=1e-5)
        theta_bar = batched


def test_gaussian_single_client_equals_batched():
    target = hetero_gaussian(4, 3, dtype=torch.float64)
    s = fahmc.Settings(0.05, 5, 3, rho=0.3, grad_noise=1.0)
    theta_bar = torch.zeros(3, 3, dtype=torch.float64)
    batched = fahmc.step(5, fahmc.init(theta_bar, s), target, s)[0].position
    message = fahmc.Broadcast(1, round_seed(5, 1), theta_bar)
    ones = [
        client_update(message, target.client(c), s, torch.tensor([client_seed(5, c)])).position[
            :, 0
        ]
        for c in range(4)
    ]
    torch.testing.assert_close(sum(0.25 * o for o in ones), batched)


@pytest.mark.parametrize("hidden", [(6,), (4, 7), (3, 5, 4)])
def test_mlp_hand_written_backprop_equals_autograd(hidden):
    gen = torch.Generator().manual_seed(3)
    model = MLP(5, 3, hidden)
    M, B = 4, 9
    theta = torch.randn(M, model.dim, dtype=torch.float64, generator=gen)
    X = torch.randn(M, B, 5, dtype=torch.float64, generator=gen)
    y = torch.randint(0, 3, (M, B), generator=gen)
    sw = torch.rand(M, B, dtype=torch.float64, generator=gen)
    sw[:, -2:] = 0.0  # padded rows of a ragged minibatch carry no weight
    g_ref, v_ref = model._grad(theta, X, y, sw)  # through torch.func
    g, v = model.loss_grad(theta, X, y, sw, True)
    torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(v, v_ref)
    g2, v2 = model.loss_grad(theta, X, y, sw, False)
    assert v2 is None
    torch.testing.assert_close(g2, g_ref)


def test_prefetching_ahead_draws_the_same_minibatches(monkeypatch):
    import fedhmc.models.targets as targets_mod
    from fedhmc.core import rng as rng_mod

    parts = make_parts([30, 17, 25])
    model = LogisticRegression(5, 3)
    keys = rng_mod.derive(3, torch.arange(6).view(2, 3))
    theta = torch.randn(2, 3, model.dim, dtype=torch.float64)
    one = DataTarget(model, parts, batch_size=8, prior_std=1.0, dtype=torch.float64)
    ahead = DataTarget(model, parts, batch_size=8, prior_std=1.0, dtype=torch.float64)
    # A budget that holds 3 evaluations: the horizon of 10 is drawn in several blocks.
    monkeypatch.setattr(targets_mod, "PREFETCH_MAX_VALUES", 3 * 6 * 30)
    for index in range(10):
        ahead.prefetch(keys, index, 1, horizon=10 - index)
        g_ahead, e_ahead = ahead.grad(theta.clone(), keys, index)
        g_one, e_one = one.grad(theta.clone(), keys, index)  # drawn one at a time
        torch.testing.assert_close(g_ahead, g_one, rtol=0, atol=0)
        torch.testing.assert_close(e_ahead, e_one, rtol=0, atol=0)
