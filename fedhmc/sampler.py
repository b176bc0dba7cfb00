"""Moved to :mod:`fedhmc.algorithms.fahmc`. This name stays so that code written against the
earlier layout keeps working; it warns once and re-exports everything."""

import warnings

from fedhmc.algorithms.fahmc import *  # noqa: F403

warnings.warn(
    "fedhmc.sampler moved to fedhmc.algorithms.fahmc; import from there",
    DeprecationWarning,
    stacklevel=2,
)
