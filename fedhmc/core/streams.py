"""Every random-number stream of fedhmc, in one table.

Randomness is counter-based ([`fedhmc.core.rng`][fedhmc.core.rng]): a key is derived from the run's
seed, a *stream id* and indices (client, chain, round, ...), and the draws are a function of that
key and a counter. Each use of randomness has its own stream id, so no two uses ever share numbers,
and adding a use never changes the numbers of another. A test checks that the ids are unique.
"""

from __future__ import annotations

# FA-HMC, FA-LD and the debiased variant (fedhmc.algorithms.fahmc, .debiased), the engine
STREAM_MOMENTUM = 1  # momentum draws
STREAM_MINIBATCH = 2  # uniform minibatch indices
STREAM_GRAD_NOISE = 3  # injected gradient noise (--grad-noise)
STREAM_CLIENT = 4  # a client's seed from the run's seed
STREAM_ROUND = 5  # a round's seed from the run's seed
STREAM_CHAIN = 6  # a chain's key (stale SG-MCMC, reference HMC)
STREAM_INIT = 7  # the chains' initial positions
STREAM_ANCHOR = 8  # the debiased variant's anchor gradients
STREAM_RESHUFFLE = 9  # random-reshuffling permutations
STREAM_PARTICIPATION = 10  # the clients drawn in a round (partial participation)

# Stale-gradient SGHMC / SGLD (fedhmc.algorithms.stale) and its asynchronous version
STREAM_STALE_NOISE = 21
STREAM_STALE_DELAY = 22
STREAM_STALE_BATCH = 23
STREAM_ASYNC_BATCH = 24  # an asynchronous worker's minibatches

# Reference Metropolis-adjusted HMC (fedhmc.algorithms.mhmc)
STREAM_MHMC_MOMENTUM = 41
STREAM_MHMC_ACCEPT = 42
STREAM_MHMC_JITTER = 43

# Shared-memory delayed SGLD (fedhmc.algorithms.delayed)
STREAM_DELAYED_NOISE = 51
STREAM_DELAYED_BATCH = 52
# QLSD (fedhmc.algorithms.qlsd)
STREAM_QLSD_QUANT = 61  # a client's quantisation draws
STREAM_QLSD_NOISE = 62  # the server's Langevin noise
# FSGLD (fedhmc.algorithms.fsgld)
STREAM_FSGLD_NOISE = 81  # a client's Langevin noise (surrogate fits and rounds)

# DG-LMC (fedhmc.algorithms.dglmc)
STREAM_DGLMC_THETA = 71  # the server's draw of θ given the clients' copies
STREAM_DGLMC_NOISE = 72  # a client's Langevin noise


def table() -> dict[str, int]:
    """Every stream id by name."""
    return {k: v for k, v in globals().items() if k.startswith("STREAM_")}
