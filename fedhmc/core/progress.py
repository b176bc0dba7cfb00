"""Progress bars for long work, with one switch for the whole process.

Every long command (``fedhmc run``, ``sweep``, ``experiment``, ``python -m benchmarks``)
shows its progress through `bar`: a tqdm bar with the elapsed time and an estimate of
the time left, drawn only on a terminal. ``--quiet`` turns every bar of the process off
(`set_quiet`).
"""

from __future__ import annotations

import weakref

_quiet = False


def set_quiet(quiet: bool) -> None:
    """Turn every later progress bar of this process off (``--quiet``) or back on."""
    global _quiet
    _quiet = bool(quiet)


PLAIN_INTERVAL = 30.0
"""Seconds between the plain progress lines written where standard error is not a terminal
(``$FEDHMC_PROGRESS_INTERVAL`` overrides it; 0 writes a line after every item instead)."""

INTERVAL_ENV = "FEDHMC_PROGRESS_INTERVAL"


def plain_interval() -> float:
    """The seconds between plain progress lines: ``$FEDHMC_PROGRESS_INTERVAL`` when it is
    a number ≥ 0, else ``PLAIN_INTERVAL``."""
    import math
    import os

    try:
        every = float(os.environ.get(INTERVAL_ENV, PLAIN_INTERVAL))
    except ValueError:
        return PLAIN_INTERVAL
    return every if math.isfinite(every) and every >= 0 else PLAIN_INTERVAL


def format_rate(value: float) -> str:
    """A rate for people to read: whole numbers with thousands separators from 10 up
    (``39,533``), two significant digits below (``3.4``, ``0.27``, ``0.0053``)."""
    import math

    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 9.95 or value == 0:
        return f"{value:,.0f}"
    return f"{value:#.2g}".rstrip(".")


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class PlainProgress:
    """Progress for logs and batch jobs: a plain line on standard error every
    ``interval`` seconds (default `plain_interval`; from a timer, so also while one long
    item runs) saying what is done, the time elapsed and an estimate of the time left; with
    an interval of 0, a line after every item instead (no timer). The same methods as the
    tqdm bar that terminals get."""

    def __init__(self, total: int, desc: str, unit: str, initial: int = 0, interval=None):
        import threading
        import time

        self.total, self.desc, self.unit = int(total), desc, unit
        self.n = self._start_n = int(initial)
        self.postfix = ""
        self._t0 = time.monotonic()
        self._clock = time.monotonic
        self.interval = plain_interval() if interval is None else float(interval)
        self._stop = threading.Event()
        self._thread = None
        if self.interval > 0:
            # The thread holds the bar only weakly: a bar that its caller drops without
            # closing (an exception on the way) stops printing once it is collected.
            self._thread = threading.Thread(
                target=PlainProgress._loop,
                args=(weakref.ref(self), self._stop, self.interval),
                daemon=True,
            )
            self._thread.start()

    def line(self) -> str:
        elapsed = self._clock() - self._t0
        done = self.n - self._start_n
        if done > 0 and self.total > self.n:
            left = f"about {_duration(elapsed / done * (self.total - self.n))} left"
        elif self.n >= self.total:
            left = "done"
        else:
            left = "time left not known yet"
        extra = f" ({self.postfix})" if self.postfix else ""
        return (
            f"{self.desc}: {self.n}/{self.total} {self.unit}s done, {_duration(elapsed)} "
            f"elapsed, {left}{extra}"
        )

    @staticmethod
    def _loop(ref, stop, every: float) -> None:
        import sys

        while not stop.wait(every):
            bar = ref()
            if bar is None:
                return
            print(bar.line(), file=sys.stderr, flush=True)
            del bar

    def __del__(self) -> None:
        self._stop.set()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.interval <= 0:
            self.write(self.line())

    def set_postfix(self, values: dict | None = None, refresh: bool = False, **kw) -> None:
        items = {**(values or {}), **kw}
        self.postfix = ", ".join(f"{k} {v}" for k, v in items.items())

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def write(self, message: str) -> None:
        """A line of its own (tqdm's ``write``)."""
        import sys

        print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        self._stop.set()


def bar(total: int, desc: str, unit: str, *, initial: int = 0, **kwargs):
    """A progress bar over ``total`` items with an ETA; None when quiet.

    On a terminal it is a tqdm bar that does not stay on screen when done; elsewhere (a log
    file, a batch job) a ``PlainProgress`` that writes a line every 30 s
    (``$FEDHMC_PROGRESS_INTERVAL``).
    """
    if _quiet:
        return None
    import sys

    auto = "file" not in kwargs and kwargs.get("disable") is None
    if auto and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return PlainProgress(total, desc, unit, initial)
    from tqdm.auto import tqdm

    kwargs.setdefault("leave", False)
    kwargs.setdefault("disable", None)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, **kwargs)


class _Null:
    """What `bar_or_null` gives when quiet: ``update`` and ``close`` do nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def bar_or_null(total: int, desc: str, unit: str, **kwargs):
    """`bar`, or an object with the same methods that does nothing when quiet."""
    b = bar(total, desc, unit, **kwargs)
    return _Null() if b is None else b


def track(items, desc: str, unit: str):
    """Iterate over ``items`` (a sized collection) with a progress bar that advances after
    each item's work is done, and closes at the end."""
    items = list(items)
    b = bar_or_null(len(items), desc, unit)
    try:
        for item in items:
            yield item
            b.update(1)
    finally:
        b.close()
