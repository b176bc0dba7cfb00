"""Moved to :mod:`fedhmc.runtime.config`. This name stays so that code written against the
earlier layout keeps working; it warns once and re-exports everything."""

import warnings

from fedhmc.runtime.config import *  # noqa: F403

warnings.warn(
    "fedhmc.config moved to fedhmc.runtime.config; import from there",
    DeprecationWarning,
    stacklevel=2,
)
