"""Likelihood models on flat parameter vectors, batched over a leading row dimension.

A row is one (chain, client) pair: the engine folds chains and clients into rows so that
every client and every chain advances in one tensor computation. Parameters are flat
vectors θ ∈ R^D, so that averaging, momentum, samples and the Flower payload are all plain
(rows, D) tensors.

Each model provides

- ``prepare(X)``: the per-example features it stores (logistic regression appends a 1 for
  the bias, so that its gradient is one batched matrix product);
- ``loss_grad(theta, X, y, sw)``: the weighted negative log-likelihood Σ_i sw_i ℓ(θ; z_i)
  of each row and its gradient, for theta (M, D), X (M, B, F), y (M, B), sw (M, B);
- ``log_probs(theta, X)``: class log-probabilities, (M, n, C) for theta (M, D), X (n, F).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, vmap

from fedhmc.core import rng

_MINUS_ONE: dict = {}


def _minus_ones(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A cached (1, 1, 1) tensor holding −1, to expand as scatter_add_'s source."""
    key = (dtype, device)
    t = _MINUS_ONE.get(key)
    if t is None:
        t = _MINUS_ONE[key] = torch.full((1, 1, 1), -1.0, dtype=dtype, device=device)
    return t


class LogisticRegression:
    r"""Multiclass (softmax) logistic regression with a bias, closed-form gradient.

    θ reshapes to $W \in \mathbb{R}^{(F+1) \times C}$; logits = [x, 1] W. The gradient of
    Σ_i sw_i ℓ_i is X̃ᵀ (sw ⊙ (softmax(X̃W) − onehot(y))), two batched matrix products.
    """

    name = "logistic"

    def __init__(self, num_features: int, num_classes: int):
        self.num_features = num_features
        self.num_classes = num_classes
        self.dim = (num_features + 1) * num_classes

    def prepare(self, X: torch.Tensor) -> torch.Tensor:
        """[x, 1] of each example (n, F + 1); features of any shape are flattened first."""
        X = X.flatten(1) if X.dim() > 2 else X
        ones = torch.ones(*X.shape[:-1], 1, dtype=X.dtype, device=X.device)
        return torch.cat([X, ones], dim=-1)

    def init(self, kind: str, keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """θ (S, D) at round 0: ``auto`` is zeros (the energy is convex); ``module`` and
        ``torch-linear`` draw PyTorch's ``nn.Linear`` initialisation."""
        return _linear_model_init(self, kind, keys, dtype, auto="zeros")

    def _weights(self, theta: torch.Tensor) -> torch.Tensor:
        return theta.view(*theta.shape[:-1], self.num_features + 1, self.num_classes)

    def loss_grad(
        self,
        theta: torch.Tensor,
        X: torch.Tensor,
        y: torch.Tensor,
        sw: torch.Tensor,
        need_value: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Classes-major layout: logitsᵀ = Wᵀ X̃ᵀ (M, C, B) and ∇ᵀ = Rᵀ X̃ (M, C, F+1). Both
        # products then read X̃ row by row with a short (C-row) left operand, which a CPU
        # runs faster than X̃ W and X̃ᵀ R; the sums are the same up to float rounding order.
        # bmm rather than matmul, and a cached −1 for the one-hot: the same products with
        # fewer dispatches, which is most of the cost at small shapes.
        Wt = self._weights(theta).transpose(-1, -2).contiguous()  # (M, C, F+1)
        logits = torch.bmm(Wt, X.transpose(-1, -2))  # (M, C, B)
        yy = y.unsqueeze(-2)
        nll = None
        if need_value:
            logp = torch.log_softmax(logits, dim=-2)
            nll = -(torch.gather(logp, -2, yy).squeeze(-2) * sw).sum(-1)
            resid = logp.exp_()
        else:
            resid = torch.softmax(logits, dim=-2)
        resid.scatter_add_(-2, yy, _minus_ones(resid.dtype, resid.device).expand_as(yy))
        resid.mul_(sw.unsqueeze(-2))
        grad_t = torch.bmm(resid, X)  # (M, C, F+1)
        return grad_t.transpose(-1, -2).reshape(theta.shape), nll

    def shared_loss_grad(
        self,
        theta: torch.Tensor,
        X: torch.Tensor,
        y: torch.Tensor,
        sw: torch.Tensor,
        need_value: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`loss_grad` when every chain sees the same data (full batch).

        θ is (S, N, D) and X (N, n, F+1): the chains become extra columns of each client's
        weight matrix, so X is read once per client instead of being copied per chain.
        Returns the gradient (S, N, D) and the weighted NLL (S, N).
        """
        S, N, _ = theta.shape
        F1, C = self.num_features + 1, self.num_classes
        n = X.shape[1]
        # Classes-major, as in loss_grad: (S·C)-row left operands read X once.
        Wt = theta.reshape(S, N, F1, C).permute(1, 0, 3, 2).reshape(N, S * C, F1)
        logits = torch.bmm(Wt, X.transpose(1, 2)).view(N, S, C, n)
        yy = y.view(N, 1, 1, n).expand(N, S, 1, n)
        nll = None
        if need_value:
            logp = torch.log_softmax(logits, dim=2)
            nll = -(logp.gather(2, yy).squeeze(2) * sw.view(N, 1, n)).sum(-1).T  # (S, N)
            resid = logp.exp_()
        else:
            resid = torch.softmax(logits, dim=2)
        resid.scatter_add_(2, yy, torch.full_like(resid[:, :, :1], -1.0))
        resid.mul_(sw.view(N, 1, 1, n))
        grad_t = torch.bmm(resid.view(N, S * C, n), X)  # (N, S·C, F1)
        grad = grad_t.view(N, S, C, F1).permute(1, 0, 3, 2).reshape(S, N, F1 * C)
        return grad, nll

    def log_probs(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(torch.matmul(X, self._weights(theta)), dim=-1)

    def linear_init_bounds(self) -> torch.Tensor:
        """Per-parameter bound b of PyTorch's default ``nn.Linear`` initialisation,
        U(−b, b) with b = 1/√fan_in for weights and bias alike: (D,)."""
        # Initial positions are drawn on the CPU (the same bits everywhere), then moved.
        return torch.full((self.dim,), 1.0 / math.sqrt(self.num_features), device="cpu")


class MLP:
    """Fully connected ReLU network, batched over rows with ``torch.func.vmap``.

    The paper's §5.4 model has two hidden layers. Initial weights are drawn by the
    engine; this class only defines the likelihood. Parameters are laid out as the
    ``state_dict`` of ``nn.Sequential(Linear, ReLU, …, Linear)`` flattened in order.
    """

    name = "mlp"

    def __init__(self, num_features: int, num_classes: int, hidden: tuple[int, ...]):
        if not hidden or any(h < 1 for h in hidden):
            raise ValueError(f"hidden widths must be positive integers, got {hidden}")
        self.num_features = num_features
        self.num_classes = num_classes
        self.hidden = tuple(hidden)
        widths = (num_features, *hidden, num_classes)
        layers: list[torch.nn.Module] = []
        for i in range(len(widths) - 1):
            layers.append(torch.nn.Linear(widths[i], widths[i + 1], device="meta"))
            if i < len(widths) - 2:
                layers.append(torch.nn.ReLU())
        self.net = torch.nn.Sequential(*layers)  # on "meta": shapes only, no draws
        self.shapes = {k: tuple(v.shape) for k, v in self.net.state_dict().items()}
        self.dim = sum(math.prod(s) for s in self.shapes.values())
        self._grad = vmap(grad_and_value(self._row_loss))

    def prepare(self, X: torch.Tensor) -> torch.Tensor:
        """The features, flattened to (n, F) if they have a shape."""
        return X.flatten(1) if X.dim() > 2 else X

    def init(self, kind: str, keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """θ (S, D) at round 0: ``auto`` draws the weights from N(0, 2 / fan_in) and sets the
        biases to 0 (a zero start is a saddle: every hidden unit alike); ``module`` and
        ``torch-linear`` draw PyTorch's ``nn.Linear`` initialisation."""
        return _linear_model_init(self, kind, keys, dtype, auto="he")

    def fan_in(self) -> torch.Tensor:
        """Per-parameter fan-in, (D,), for a He-style initialisation; inf for biases (start 0)."""
        parts = []
        for shape in self.shapes.values():
            fan = float(shape[-1]) if len(shape) > 1 else math.inf
            parts.append(torch.full((math.prod(shape),), fan, device="cpu"))  # init: CPU
        return torch.cat(parts)

    def linear_init_bounds(self) -> torch.Tensor:
        """Per-parameter bound b of PyTorch's default ``nn.Linear`` initialisation,
        U(−b, b) with b = 1/√fan_in of the layer, for its weight and its bias: (D,)."""
        parts, fan = [], 1.0
        for shape in self.shapes.values():
            if len(shape) > 1:
                fan = float(shape[-1])
            parts.append(torch.full((math.prod(shape),), 1.0 / math.sqrt(fan), device="cpu"))
        return torch.cat(parts)

    def _unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        out, i = {}, 0
        for name, shape in self.shapes.items():
            n = math.prod(shape)
            out[name] = theta[..., i : i + n].reshape(*theta.shape[:-1], *shape)
            i += n
        return out

    def _logits(self, theta_row: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        return functional_call(self.net, self._unflatten(theta_row), (X,))

    def _row_loss(self, theta_row, X, y, sw):
        logp = torch.log_softmax(self._logits(theta_row, X), dim=-1)
        return -(logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) * sw).sum()

    def loss_grad(self, theta, X, y, sw, need_value: bool = True):
        r"""Σ_i sw_i ℓ_i of each row and its gradient by hand-written batched backprop.

        Forward: $z_l = a_{l-1} W_l^\top + b_l$ (one ``baddbmm`` per layer),
        $a_l = \mathrm{ReLU}(z_l)$. Backward from
        $r = sw \odot (\mathrm{softmax} - \mathrm{onehot})$:
        $\nabla W_l = r_l^\top a_{l-1}$, $\nabla b_l = \sum_i r_l$,
        $r_{l-1} = (r_l W_l) \odot \mathbb{1}[z_{l-1} > 0]$. The same numbers as autograd through
        `_row_loss` (tested), at about the cost of the plain batched kernel.
        """
        params = self._unflatten(theta)
        names = list(params)
        weights = [params[n] for n in names[0::2]]  # (M, out, in)
        biases = [params[n] for n in names[1::2]]  # (M, out)
        # Activations are kept features-major, (M, width, B): the products then have the
        # short weight matrix on the left, which is faster on CPU than (M, B, width).
        acts = [X.transpose(1, 2)]
        for i, (W, b) in enumerate(zip(weights, biases, strict=True)):
            z = torch.baddbmm(b.unsqueeze(2), W, acts[-1])
            acts.append(z.clamp_(min=0.0) if i < len(weights) - 1 else z)
        logits = acts.pop()  # (M, C, B)
        yy = y.unsqueeze(1)
        nll = None
        if need_value:
            logp = torch.log_softmax(logits, dim=1)
            nll = -(logp.gather(1, yy).squeeze(1) * sw).sum(-1)
            resid = logp.exp_()
        else:
            resid = torch.softmax(logits, dim=1)
        resid.scatter_add_(1, yy, torch.full_like(resid[:, :1], -1.0))
        resid.mul_(sw.unsqueeze(1))
        grads: list[torch.Tensor] = []
        r = resid
        for i in range(len(weights) - 1, -1, -1):
            a_prev = acts[i]
            grads.append(r.sum(2))  # ∇b_i
            grads.append(torch.bmm(r, a_prev.transpose(1, 2)))  # ∇W_i, (M, out, in)
            if i > 0:
                r = torch.bmm(weights[i].transpose(1, 2), r).mul_(a_prev > 0)
        grads.reverse()  # W_0, b_0, W_1, b_1, …: the state_dict order
        M = theta.shape[0]
        return torch.cat([g.reshape(M, -1) for g in grads], dim=1), nll

    def log_probs(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        out = vmap(self._logits, in_dims=(0, None))(theta, X)
        return F.log_softmax(out, dim=-1)


def _linear_model_init(model, kind: str, keys: torch.Tensor, dtype, auto: str) -> torch.Tensor:
    """The initial positions of the built-in models, drawn from the streams under ``keys``
    (the run seed's initialisation stream, one key per chain)."""
    dim = model.dim
    if kind == "auto":
        kind = auto
    if kind == "zeros":
        return torch.zeros(keys.shape[0], dim, dtype=dtype, device=keys.device)
    if kind == "normal":
        return rng.normal(keys, 0, dim, dtype)
    if kind == "he":
        z = rng.normal(keys, 0, dim, dtype)
        return z * torch.sqrt(2.0 / model.fan_in()).to(dtype)
    if kind in ("module", "torch-linear"):
        u = rng.uniform(keys, 1, dim)
        bound = model.linear_init_bounds().to(torch.float64)
        return ((2.0 * u - 1.0) * bound).to(dtype)
    raise ValueError(f"unknown initialisation {kind!r}")


def build_network(name: str, num_features: int, num_classes: int, hidden: tuple[int, ...]):
    """The model called ``name`` ("logistic" or "mlp")."""
    if name == "logistic":
        return LogisticRegression(num_features, num_classes)
    if name == "mlp":
        return MLP(num_features, num_classes, hidden)
    raise ValueError(f"unknown model {name!r}")
