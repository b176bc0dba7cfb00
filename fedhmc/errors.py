"""User-facing errors.

Every error a user can cause by a bad option, a missing file or an unstable setting is a
:class:`FedHMCError`. Its message is one line that says what is wrong and how to fix it;
the command line prints that line alone, with no traceback, and exits with status 2.
"""

from __future__ import annotations


class FedHMCError(Exception):
    """Base class of the errors whose message is meant for the user, on one line."""


class ConfigError(FedHMCError, ValueError):
    """An option or a combination of options is invalid."""


class DataError(FedHMCError):
    """A dataset is missing, corrupt, or cannot be split as asked."""


class NonFiniteError(FedHMCError, FloatingPointError):
    """The chain produced a non-finite position or energy."""
