"""What Flower's simulation runtime says, kept off the terminal and in the run's folder.

While a simulation runs, Flower logs a ClientApp that raised or a client process that died
with Ray's tracebacks (its ``flwr`` logger, at ERROR), and Ray's driver prints a line for
every worker that died (``(raylet) A worker died…``, on stdout, whatever ``log_to_driver``
says). fedhmc reports each such failure itself, in one line (`fedhmc_server.exchange.
failure_reason`); `FlowerOutput` keeps the runtime's own account, tracebacks included, and
writes it to ``flower.log`` in the run's folder, where the error line points.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from pathlib import Path

from fedhmc.errors import ConfigError
from fedhmc.runtime.lock import FolderLock
from fedhmc.runtime.output import MARKER, write_text_atomic

FLOWER_LOG = "flower.log"
"""The file of a run's folder that holds what Flower's simulation logged, when it logged
anything (an earlier run's is replaced, or removed when this one logged nothing)."""

KEPT_LINES = 20_000
"""The lines kept (the last ones) of a simulation that logs without end."""

QUIETED = ("flwr", "ray")
"""The loggers whose records go to ``flower.log`` instead of the terminal."""


class _Kept(logging.Handler):
    def __init__(self, lines: deque):
        super().__init__(logging.WARNING)
        self.lines = lines
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.extend(self.format(record).splitlines())
        except Exception:  # noqa: BLE001 - a log record never stops a run
            self.handleError(record)


class FlowerOutput:
    """A context manager: inside it, the ``flwr`` and ``ray`` loggers' records (ERROR and
    above for ``flwr``, as before) and the lines Ray's driver prints are kept in ``lines``
    instead of reaching stdout or stderr. Everything is put back on leaving."""

    def __init__(self):
        self.lines: deque[str] = deque(maxlen=KEPT_LINES)
        self._saved: list = []
        self._ray = None

    def __enter__(self) -> FlowerOutput:
        try:
            import ray._private.worker as ray_worker  # Flower's simulation imports it anyway
        except ImportError:  # pragma: no cover - flwr[simulation] brings Ray
            ray_worker = None
        for name in QUIETED:
            logger = logging.getLogger(name)
            kept = _Kept(self.lines)  # one each: ray.init sets its own handlers' format
            self._saved.append(
                (logger, kept, logger.level, list(logger.handlers), logger.propagate)
            )
            for h in list(logger.handlers):
                logger.removeHandler(h)
            logger.addHandler(kept)
            logger.propagate = False
        logging.getLogger("flwr").setLevel(logging.ERROR)
        printer = getattr(ray_worker, "print_to_stdstream", None)
        if printer is not None:  # the driver's error listener prints through it
            self._ray = (ray_worker, printer)
            ray_worker.print_to_stdstream = self._printed
        return self

    def _printed(self, data: dict, ignore_prefix: bool = False) -> None:
        pid = data.get("pid", "ray")
        for line in data.get("lines", []):
            self.lines.extend(f"({pid}) {part}" for part in str(line).splitlines())

    def __exit__(self, *exc) -> None:
        if self._ray is not None:
            ray_worker, printer = self._ray
            ray_worker.print_to_stdstream = printer
            self._ray = None
        for logger, kept, level, handlers, propagate in self._saved:
            logger.removeHandler(kept)
            for h in handlers:
                logger.addHandler(h)
            logger.setLevel(level)
            logger.propagate = propagate
        self._saved = []

    def write(self, out: str | os.PathLike) -> Path | None:
        """``out/flower.log`` with the kept lines, when there are any and ``out`` is a run
        folder (fedhmc's marker) free to take; None when nothing was written. A folder
        without them loses an earlier run's ``flower.log``: the file is always this run's."""
        path = Path(out) / FLOWER_LOG
        if not (Path(out) / MARKER).is_file():
            return None  # the run never started there: nothing of it to write
        try:
            lock = FolderLock(out).acquire()
        except ConfigError:
            return None  # in use by another process by now: its folder, not ours to write
        try:
            if not self.lines:
                path.unlink(missing_ok=True)
                return None
            write_text_atomic(path, "\n".join(self.lines) + "\n")
            return path
        except OSError:
            return None  # (a full disk: the run's own error says so)
        finally:
            lock.release()
