"""The ``fedhmc`` command line, one module per subcommand; `main` is the entry point.

Importing the subcommands (and torch) takes a second or more: a Ctrl-C meanwhile ends the
command with one line instead of a traceback (nothing has been written yet).
"""

import os
import signal
import sys
import threading


def _interrupted_while_starting(signum, frame):  # pragma: no cover - timing-dependent
    sys.stderr.write("fedhmc: interrupted while starting; nothing was written\n")
    sys.stderr.flush()
    os._exit(128 + signum)


_main_thread = threading.current_thread() is threading.main_thread()
_before = signal.signal(signal.SIGINT, _interrupted_while_starting) if _main_thread else None
try:
    from fedhmc.cli.main import main
finally:
    if _main_thread:
        signal.signal(signal.SIGINT, _before)

__all__ = ["main"]
