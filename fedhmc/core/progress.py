"""Progress bars for long work, with one switch for the whole process.

Every long command (``fedhmc run``, ``sweep``, ``experiment``, ``python -m benchmarks``)
shows its progress through :func:`bar`: a tqdm bar with the elapsed time and an estimate of
the time left, drawn only on a terminal. ``--quiet`` turns every bar of the process off
(:func:`set_quiet`).
"""

from __future__ import annotations

_quiet = False


def set_quiet(quiet: bool) -> None:
    """Turn every later progress bar of this process off (``--quiet``) or back on."""
    global _quiet
    _quiet = bool(quiet)


def bar(total: int, desc: str, unit: str, *, initial: int = 0, **kwargs):
    """A progress bar over ``total`` items with an ETA; None when quiet.

    It draws only where standard error is a terminal (tqdm's ``disable=None``) and does not
    stay on screen when done.
    """
    if _quiet:
        return None
    from tqdm.auto import tqdm

    kwargs.setdefault("leave", False)
    kwargs.setdefault("disable", None)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, **kwargs)


class _Null:
    """What :func:`bar_or_null` gives when quiet: ``update`` and ``close`` do nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def bar_or_null(total: int, desc: str, unit: str, **kwargs):
    """:func:`bar`, or an object with the same methods that does nothing when quiet."""
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
