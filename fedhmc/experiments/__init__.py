"""The papers' experiments as commands: ``fedhmc experiment NAME``.

Each experiment is a function ``(out_dir, *, quick=False, seed=0) -> dict`` that writes a
CSV table, a JSON summary and a PNG plot to ``out_dir`` and returns the table. ``quick``
shrinks it to seconds (what the tests run).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fedhmc.experiments.blr_d10 import blr_d10
from fedhmc.experiments.blr_eta import blr_eta
from fedhmc.experiments.blr_t import blr_t, paper_blr_t
from fedhmc.experiments.cifar2 import cifar2
from fedhmc.experiments.debiased_gaussian import debiased_gaussian
from fedhmc.experiments.delayed_sgld import delayed_sgld_experiment
from fedhmc.experiments.fmnist_cnn import fmnist_cnn
from fedhmc.experiments.fmnist_k import fmnist_k
from fedhmc.experiments.fmnist_mlp import fmnist_mlp
from fedhmc.experiments.fmnist_t import fmnist_t
from fedhmc.experiments.gaussian_dim import gaussian_dim
from fedhmc.experiments.kmnist import kmnist
from fedhmc.experiments.paper_fmnist import paper_figure
from fedhmc.experiments.participation import participation
from fedhmc.experiments.samplers import samplers
from fedhmc.experiments.stale_gaussian import stale_gaussian
from fedhmc.experiments.stale_variance import stale_variance

EXPERIMENTS: dict[str, tuple[Callable, str]] = {
    "delayed-sgld": (
        delayed_sgld_experiment,
        "Kungurtsev et al. §3.2: shared-memory delayed SGLD (sync, w-con, w-icon), W₂ vs time",
    ),
    "debiased-gaussian": (
        debiased_gaussian,
        "bias of plain vs debiased FA-HMC on the heterogeneous Gaussian, T ∈ {10, 50, 200}",
    ),
    "gaussian-dim": (
        gaussian_dim,
        "heterogeneous Gaussian: rounds to reach W₂² < 0.1 against dimension (Figure 2)",
    ),
    "blr-eta": (blr_eta, "simulated BLR: ME of FA-HMC and FA-LD against η (Figure 1a, b)"),
    "blr-d10": (blr_d10, "simulated BLR, d = 10: ME against η (Figure 1d)"),
    "blr-T": (
        blr_t,
        "simulated BLR, K = 100, η = 0.01: rounds to an ME against T (Figure 1c)",
    ),
    "fmnist-K": (fmnist_k, "Fashion-MNIST logistic regression, K ∈ {1, 10, 50, 100} at T = 50"),
    "fmnist-T": (
        fmnist_t,
        "Fashion-MNIST logistic regression, T ∈ {1, 10, 20, 50, 100} at K = 10",
    ),
    "fmnist-mlp": (fmnist_mlp, "Fashion-MNIST two-hidden-layer MLP, K grid"),
    "fmnist-cnn": (
        fmnist_cnn,
        "Fashion-MNIST LeNet-5 (any nn.Module's path): FA-HMC (K = 10) against FA-LD at T = 50",
    ),
    "kmnist": (kmnist, "KMNIST logistic regression, K grid (needs the KMNIST files)"),
    "cifar2": (cifar2, "CIFAR-2 logistic regression, K grid (needs the CIFAR-10 batches)"),
    "stale-gaussian": (
        stale_gaussian,
        "Chen et al. §5.1: MSE of stale SGHMC against staleness δ at L = L₀·δ",
    ),
    "participation": (
        participation,
        "partial participation: S clients a round under 3 schemes, FA-HMC against FA-LD on "
        "Fashion-MNIST at a fixed budget of client-rounds; the Gaussian's bias against S",
    ),
    "stale-variance": (
        stale_variance,
        "Chen et al. §5.1: variance of the test loss against iterations per worker, W workers",
    ),
    "samplers": (
        samplers,
        "every federated sampler (FA-HMC, FA-LD, debiased FA-HMC, QLSD, QLSD*, QLSD++, FSGLD, "
        "DG-LMC), each tuned by one rule, at equal gradient budgets on the Gaussian (W₂), "
        "simulated BLR (ME) and Fashion-MNIST",
    ),
}


def _paper(name: str) -> Callable:
    """Figure ``name`` of fedhmc.experiments.paper_fmnist.FIGURES as an experiment."""

    def fn(
        out_dir: Path,
        *,
        quick: bool = False,
        seed: int = 0,
        full: bool = False,
        workers=1,
        neighbour_eta: bool = False,
    ):
        return paper_figure(
            name,
            out_dir,
            quick=quick,
            full=full,
            seed=seed,
            workers=workers,
            neighbour_eta=neighbour_eta,
        )

    fn.__name__ = name.replace("-", "_")
    return fn


EXPERIMENTS.update(
    {
        "paper-fmnist-K": (
            _paper("paper-fmnist-K"),
            "Figure 3 under the authors' protocol and Algorithm 3: K ∈ {1, 10, 50, 100}, "
            "T = 50 leapfrog steps, η tuned, 5 seeds (--full: 200 rounds)",
        ),
        "paper-fmnist-T": (
            _paper("paper-fmnist-T"),
            "Figure 4 under both protocols: T ∈ {1, 10, 20, 50, 100} at K = 10",
        ),
        "paper-fmnist-K-dirichlet": (
            _paper("paper-fmnist-K-dirichlet"),
            "Figure 3's grid on Dirichlet(0.1) clients, both protocols",
        ),
        "paper-fmnist-T-dirichlet": (
            _paper("paper-fmnist-T-dirichlet"),
            "Figure 4's grid on Dirichlet(0.1) clients, both protocols",
        ),
        "paper-blr-T": (
            paper_blr_t,
            "Figure 1(c) under both protocols: rounds to reach an ME against T (both ways of "
            "counting the authors' rounds), and the odd/even-T bias question",
        ),
        "paper-fmnist-mlp": (
            _paper("paper-fmnist-mlp"),
            "the MLP at K ∈ {1, 10, 50}, T = 50, both protocols, one seed",
        ),
    }
)


DEVICE_EXPERIMENTS = frozenset(
    {
        "fmnist-K",
        "fmnist-T",
        "fmnist-mlp",
        "fmnist-cnn",
        "kmnist",
        "cifar2",
        "participation",
        *(name for name in EXPERIMENTS if name.startswith("paper-fmnist")),
    }
)
"""The experiments that run on data through run cells, and so on ``--device`` (the
others run small closed-form or simulated targets on the CPU; participation's Gaussian
part too)."""


DURATIONS: dict[str, tuple[str, str | None]] = {
    # name: (default budget, --full budget, or None when there is none), on 2 CPU cores,
    # as measured for the results pages (the --full paper figures: their cells' wall time
    # summed, halved for --workers 2).
    "delayed-sgld": ("3-8 min", None),
    "debiased-gaussian": ("35 s", None),
    "gaussian-dim": ("not measured", None),
    "blr-eta": ("4 min", "not measured"),
    "blr-d10": ("40 s", "not measured"),
    "blr-T": ("8 min", "not measured"),
    "fmnist-K": ("5 min", "not measured"),
    "fmnist-T": ("5 min", "not measured"),
    "fmnist-mlp": ("not measured", "not measured"),
    "fmnist-cnn": ("35 min", "days (meant for a GPU)"),
    "kmnist": ("not measured", "not measured"),
    "cifar2": ("not measured", "not measured"),
    "stale-gaussian": ("15 s", None),
    "participation": ("not measured", "1.5 h with --workers 2"),
    "stale-variance": ("2 min", None),
    "paper-fmnist-K": ("not measured", "4-5 h with --workers 2"),
    "paper-fmnist-T": ("not measured", "3 h with --workers 2"),
    "paper-fmnist-K-dirichlet": ("not measured", "4 h with --workers 2"),
    "paper-fmnist-T-dirichlet": ("not measured", "2.5 h with --workers 2"),
    "paper-blr-T": ("not measured", "under 2 h (d = 100)"),
    "paper-fmnist-mlp": ("not measured", "1.5 h with --workers 2"),
    "samplers": ("9 min with --workers 2", "2 h with --workers 2"),
}
"""Each preset's estimated duration at its default and ``--full`` budgets (``--list``)."""
