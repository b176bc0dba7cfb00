"""Shared-memory delayed SGLD (Kungurtsev, Chatterjee, Alistarh; docs/algorithms.md).

P worker processes on one machine share the parameter tensor X (``share_memory_()``) and
run SGLD on it,

    X_{k+1} = X_k − γ ∇Ũ(X̂_k) + √(2τγ) G_k,

where X̂_k is whatever X the worker read before computing its minibatch gradient. Three
modes, as in the paper's §3.1:

- ``sync``: two barriers per iteration. Every worker reads the same X, computes its noisy
  increment −γ ∇Ũ_p(X) + √(2τγ) G_p on its own minibatch, and one updater (worker 0) adds the sum of
  the P increments to X. This is the paper's "updater sums the gradients": an SGLD step of size Pγ
  with the average of P minibatch gradients, deterministic given the seed
  ([`sequential_reference`][fedhmc.algorithms.delayed.sequential_reference] computes the same chain
  in one process).
- ``w-con``: asynchronous, with consistent reads: a lock is held while a worker copies X
  and while it adds its increment. Gradients are stale by however many other updates were
  applied between a worker's read and its write (the staleness histogram counts these).
- ``w-icon``: asynchronous and lock-free (Hogwild): reads may see a partly written X and
  concurrent in-place additions may overwrite each other.

X holds R independent chains (shape (R, d)), advanced together by every update, so the law
of X_k is observed directly (the empirical distribution of the R chains) rather than
through one chain's trajectory. The chains share the timing (the delays) of the run, and
each has its own minibatches and noise.

Randomness is counter-based ([`fedhmc.core.rng`][fedhmc.core.rng]): worker p's j-th increment uses
noise and minibatch indices keyed by (seed, p, chain) and counter j, whatever the interleaving. So
``sync`` is reproducible bit for bit given the seed; ``w-con`` and ``w-icon`` draw the same numbers
but apply them in an order the operating system decides, so their chains are not reproducible (by
nature: that is what asynchrony is).

Processes are started with an explicit start method (``"spawn"`` by default: torch with
``fork`` after threads have started is unsafe), run ``torch.set_num_threads(1)``, and are
always stopped and joined: a worker that raises stops the run with a `WorkerError`
naming it, the others are told to stop (barriers aborted), joined with a timeout, then
terminated and killed if they do not exit. Every wait has a timeout.

The regression problem (a 4th-degree polynomial with a known coefficient vector, Gaussian
noise and prior) has a Gaussian posterior in closed form (`posterior`), and the
preset `delayed_sgld_experiment` (``fedhmc experiment delayed-sgld``) measures W₂ of
the R chains to it against iterations and wall time.
"""

from fedhmc.algorithms.delayed.driver import DelayedResult, run_delayed
from fedhmc.algorithms.delayed.problem import Regression, hessian_eigs, make_regression, posterior
from fedhmc.algorithms.delayed.sgld import (
    MODES,
    START_METHODS,
    Settings,
    increment,
    sequential_reference,
)
from fedhmc.algorithms.delayed.workers import WorkerError

__all__ = [
    "MODES",
    "START_METHODS",
    "DelayedResult",
    "Regression",
    "Settings",
    "WorkerError",
    "hessian_eigs",
    "increment",
    "make_regression",
    "posterior",
    "run_delayed",
    "sequential_reference",
]
