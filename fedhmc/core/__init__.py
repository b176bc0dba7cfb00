"""The sampler's building blocks: keyed randomness, the leapfrog, momentum, averaging."""

PARTICIPATION_SCHEMES = ("weighted", "uniform", "normalized")
"""Partial participation's schemes (``fedhmc.core.participation``), named here free of torch
so that the run config can offer them."""
