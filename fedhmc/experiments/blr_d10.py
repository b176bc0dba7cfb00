"""``blr-d10``: simulated BLR at d = 10, the marginal error against η (the paper's
Figure 1d).
"""

from __future__ import annotations

from pathlib import Path

from fedhmc.experiments.blr_eta import _blr_eta


def blr_d10(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """``blr-eta`` at d = 10 with stochastic gradients (the paper's Figure 1d)."""
    return _blr_eta("blr-d10", out_dir, quick, seed, full, 10, (10.0,))
