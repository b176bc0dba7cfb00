"""The stochastic leapfrog integrator (Liang et al. 2024, Algorithm 1).

With step size η, K steps and a gradient oracle ``g_k = ∇f̃(θ_k, ξ_k)``::

    θ_{k+1} = θ_k + η p_k − (η²/2) g_k
    p_{k+1} = p_k − (η/2) (g_k + g_{k+1})

Each step draws a fresh stochastic gradient; ``g_{k+1}`` is reused as the next step's
``g_k``, so K steps cost K + 1 gradient evaluations. The mass matrix is the identity.
With exact gradients this is velocity Verlet: symplectic, time-reversible, and with an
energy error of order η².
"""

from __future__ import annotations

from collections.abc import Callable

import torch

GradFn = Callable[[torch.Tensor, int], torch.Tensor]
"""``grad_fn(theta, k) -> g``: the (stochastic) gradient at ``theta`` for evaluation ``k``.

``k`` numbers the evaluations of one trajectory, 0 … K, so that a stochastic oracle can
draw its minibatch and noise for that evaluation from a counter-based stream.
"""


def leapfrog(
    grad_fn: GradFn,
    theta: torch.Tensor,
    momentum: torch.Tensor,
    step_size: float,
    num_steps: int,
    grad: torch.Tensor | None = None,
    fresh: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integrate K = ``num_steps`` stochastic leapfrog steps.

    Parameters
    ----------
    grad_fn
        Gradient oracle, see [`GradFn`][fedhmc.core.integrators.GradFn]; called K + 1 times (K times
        if ``grad`` given).
    theta, momentum
        Start position and momentum, any shape (leading dimensions are batch dimensions:
        chains, clients). They are not modified.
    step_size
        η > 0.
    num_steps
        K ≥ 1.
    grad
        The gradient at ``theta`` if already known (evaluation 0 is then skipped).
    fresh
        Evaluate two fresh gradients per step, ``g_k`` at θ_k (evaluation 2k) for the
        position and ``g_{k+1}`` at ``θ_{k+1}`` (evaluation 2k + 1) for the momentum, instead of
        reusing ``g_{k+1}`` as the next step's ``g_k``: 2K evaluations (the authors'
        experiment code). ``grad`` is then ignored.

    Returns
    -------
    (theta_K, p_K, g_K)
        End position, end momentum, and the gradient at the end position.
    """
    eta = float(step_size)
    half_eta_sq = 0.5 * eta * eta
    theta = theta.clone()
    p = momentum.clone()
    if fresh:
        g = None
        for k in range(num_steps):
            g = grad_fn(theta, 2 * k)
            theta.add_(p, alpha=eta).add_(g, alpha=-half_eta_sq)
            g_next = grad_fn(theta, 2 * k + 1)
            p.add_(g, alpha=-0.5 * eta).add_(g_next, alpha=-0.5 * eta)
            g = g_next
        return theta, p, g
    g = grad_fn(theta, 0) if grad is None else grad
    for k in range(num_steps):
        theta.add_(p, alpha=eta).add_(g, alpha=-half_eta_sq)
        g_next = grad_fn(theta, k + 1)
        p.add_(g, alpha=-0.5 * eta).add_(g_next, alpha=-0.5 * eta)
        g = g_next
    return theta, p, g
