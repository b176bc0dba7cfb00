"""The same bits in every run on a GPU: the process-wide switches a CUDA run sets.

A CUDA run makes cuDNN choose deterministic algorithms and stop autotuning (autotuning
may pick a different algorithm, with a different order of additions, in each process),
and keeps float32 convolutions and matrix products in float32 (no TF32, which rounds
their inputs to 10 bits of mantissa). The CPU is deterministic without switches.

torch sets TF32 through ``fp32_precision`` (``"ieee"``: no TF32) where it has that
interface, and through the ``allow_tf32`` flags in the supported torch versions that lack
it; the two must not be mixed, so only one is used.
"""

from __future__ import annotations

import torch


def _precision_flags() -> dict[str, object]:
    """torch's ``fp32_precision`` settings that this version has, by name."""
    places = {
        "cuda.matmul": torch.backends.cuda.matmul,
        "cudnn.conv": getattr(torch.backends.cudnn, "conv", None),
        "cudnn.rnn": getattr(torch.backends.cudnn, "rnn", None),
    }
    return {k: v for k, v in places.items() if hasattr(v, "fp32_precision")}


def deterministic_cuda(device: torch.device | str) -> None:
    """On a CUDA ``device``: cuDNN deterministic, no cuDNN autotuning, no TF32."""
    if torch.device(device).type != "cuda":
        return
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    flags = _precision_flags()
    if len(flags) == 3:
        for place in flags.values():
            place.fp32_precision = "ieee"
    else:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False


def switches() -> dict[str, object]:
    """The switches' current values, for a report."""
    out: dict[str, object] = {
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
    }
    flags = _precision_flags()
    if len(flags) == 3:
        out.update({f"{k}.fp32_precision": v.fp32_precision for k, v in flags.items()})
    else:
        out["cudnn.allow_tf32"] = torch.backends.cudnn.allow_tf32
        out["cuda.matmul.allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
    return out
