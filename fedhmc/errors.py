"""User-facing errors.

Every error a user can cause by a bad option, a missing file or an unstable setting is a
`FedHMCError`. Its message is one line that says what is wrong and how to fix it;
the command line prints that line alone, with no traceback, and exits with status 2.
"""

from __future__ import annotations

import errno


class FedHMCError(Exception):
    """Base class of the errors whose message is meant for the user, on one line."""


class ConfigError(FedHMCError, ValueError):
    """An option or a combination of options is invalid."""


class DataError(FedHMCError):
    """A dataset is missing, corrupt, or cannot be split as asked."""


class ModelError(FedHMCError, RuntimeError):
    """The user's own model code raised: the ``--model`` factory while building the module,
    or the module's forward or backward pass during a run. The message names the model and
    the original exception's type, first line and place in the user's code; the original
    exception is its ``__cause__``. A run it stops mid-way keeps its checkpoint."""


MODEL_ERROR_CODE = 3701
"""The error code of a Flower client's reply when the user's own module failed
(`ModelError`): the same on every client and in every round, so the server stops the run
at once with the client's one line instead of retrying rounds. Declared here, where the
ClientApp and the ServerApp both import it without PyTorch: Flower starts a ClientApp
process for every message."""


class RunFailed(FedHMCError):
    """The run could not go on for a reason outside its settings (the disk filled up): its
    last checkpoint is kept. The command exits with status 1."""

    exit_code = 1


class NonFiniteError(FedHMCError, FloatingPointError):
    """The chain produced a non-finite position or energy."""


class RunInterrupted(FedHMCError):
    """SIGINT or SIGTERM stopped a run after a round; its checkpoint is written. The
    command exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int, round_: int, out: str, resume_flags: str = ""):
        import signal

        self.signum, self.round, self.out = int(signum), int(round_), out
        name = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}.get(signum, str(signum))
        super().__init__(
            f"stopped by {name} after round {round_}; the checkpoint is written. "
            f"Continue with: fedhmc run --resume {out}{resume_flags}"
        )

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""The ``OSError.errno`` of a file the disk has no room for."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """``Type: the first line of its message`` (cut at ``limit`` characters)."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else ""
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def loads_json(text: str | bytes):
    """``json.loads``, where JSON nested too deeply to read (Python's recursion limit; a
    file fedhmc writes nests a few levels) is a ValueError like any other bad JSON, not a
    RecursionError."""
    import json

    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("its JSON is nested too deeply to be a file fedhmc writes") from None
