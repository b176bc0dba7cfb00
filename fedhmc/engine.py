"""Moved to :mod:`fedhmc.runtime.engine`. This name stays so that code written against the
earlier layout keeps working; it warns once and re-exports everything."""

import warnings

from fedhmc.runtime.engine import *  # noqa: F403

warnings.warn(
    "fedhmc.engine moved to fedhmc.runtime.engine; import from there",
    DeprecationWarning,
    stacklevel=2,
)
