"""Server-side averaging: θ̄ = Σ_c w_c θ^(c) (docs/algorithms.md, step 3).

Pure tensor functions, shared by the in-process engine and the Flower ServerApp.
"""

from __future__ import annotations

import torch


def weighted_average(positions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    r"""Average client positions with weights renormalised to sum to one.

    Parameters
    ----------
    positions
        Client positions, (..., N, D): clients on the second-to-last dimension.
    weights
        Non-negative weights, (N,): the clients' n_c (or w_c). They are renormalised over
        the clients given, so averaging over the clients that replied in a round uses
        $w_c / \sum_{c \text{ replied}} w_c$.

    Returns
    -------
    torch.Tensor
        The average, (..., D), in the dtype of ``positions``.
    """
    w = weights.to(torch.float64)
    total = float(w.sum())
    if not total > 0.0:
        raise ValueError("weighted_average needs at least one positive weight")
    return combine(positions, w / total)


def combine(positions: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """Σ_c a_c θ^(c) with the coefficients (N,) as given (not renormalised): the average of
    a round whose scheme fixes its own coefficients (partial participation)."""
    a = coefficients.to(positions.device, positions.dtype)
    return torch.einsum("...nd,n->...d", positions, a)


class ReplyError(ValueError):
    """A client's reply that must not enter the average; the message says why."""


def validate_reply(
    arrays: dict,
    num_examples,
    *,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    max_examples: int,
    keys: tuple[str, ...] = ("theta",),
) -> dict[str, torch.Tensor]:
    """Check one client's reply before it may enter the average.

    Parameters
    ----------
    arrays
        The reply's arrays by name (numpy arrays or tensors).
    num_examples
        The client's claimed n_c.
    shape, dtype
        What every array must be exactly: no broadcasting, no silent casts.
    max_examples
        The number of examples that client was assigned; n_c may not exceed it.
    keys
        Names that must be present.

    Returns
    -------
    dict
        The arrays as tensors.

    Raises
    ------
    ReplyError
        On a missing key, a wrong shape or dtype, a non-finite value, or an n_c that is
        not an integer in [1, max_examples].
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, (int, float)):
        raise ReplyError(f"num-examples must be an integer, got {num_examples!r}")
    if isinstance(num_examples, float) and not (
        num_examples == num_examples and num_examples.is_integer()
    ):
        raise ReplyError(f"num-examples must be an integer, got {num_examples!r}")
    if not 1 <= num_examples <= max_examples:
        raise ReplyError(f"num-examples {num_examples!r} is outside [1, {max_examples}]")
    out = {}
    for key in keys:
        if key not in arrays:
            raise ReplyError(f"missing array {key!r}")
        t = torch.as_tensor(arrays[key], device="cpu")  # a wire array: checked where it lands
        if tuple(t.shape) != tuple(shape):
            raise ReplyError(f"array {key!r} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        if t.dtype != dtype:
            raise ReplyError(f"array {key!r} has dtype {t.dtype}, expected {dtype}")
        if not bool(torch.isfinite(t).all()):
            raise ReplyError(f"array {key!r} has non-finite values")
        out[key] = t
    return out
