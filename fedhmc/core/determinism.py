"""The same bits in every run on a GPU: the process-wide switches a CUDA run sets.

A CUDA run makes cuDNN choose deterministic algorithms and stop autotuning (autotuning
may pick a different algorithm, with a different order of additions, in each process),
and keeps float32 convolutions and matrix products in float32 (no TF32, which rounds
their inputs to 10 bits of mantissa). The CPU is deterministic without switches.
"""

from __future__ import annotations

import torch


def deterministic_cuda(device: torch.device | str) -> None:
    """On a CUDA ``device``: cuDNN deterministic, no cuDNN autotuning, no TF32."""
    if torch.device(device).type != "cuda":
        return
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def switches() -> dict[str, bool]:
    """The switches' current values, for a report."""
    return {
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }
