"""The sampler's building blocks: keyed randomness, the leapfrog, momentum, averaging."""

PARTICIPATION_SCHEMES = ("weighted", "uniform", "normalized")
"""Partial participation's schemes (``fedhmc.core.participation``), named here free of torch
so that the run config can offer them."""

SYNC_UNITS = ("iteration", "leapfrog")
"""What ends an FA-HMC round (``fedhmc.algorithms.fahmc.Settings.sync_unit``)."""

MINIBATCH_LAWS = ("uniform", "reshuffle")
"""How a client's minibatches are drawn (``fedhmc.models.targets``)."""
