"""Moved to :mod:`fedhmc.models.targets`. This name stays so that code written against the
earlier layout keeps working; it warns once and re-exports everything."""

import warnings

from fedhmc.models.targets import *  # noqa: F403

warnings.warn(
    "fedhmc.targets moved to fedhmc.models.targets; import from there",
    DeprecationWarning,
    stacklevel=2,
)
