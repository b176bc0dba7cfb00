"""How many intra-op threads torch uses for a run: ``--threads N`` or ``--threads auto``.

Where a gradient evaluation is small, a second thread gains little on an idle machine and
loses much beside other busy processes, because each of the thousands of small ops waits
for the scheduler; where it is large, more threads pay. So ``auto`` uses one thread below
``AUTO_WORK`` and every core above it (the performance page has the measurements,
``python -m benchmarks --only threads``).

``auto`` is the default everywhere: ``fedhmc run``, ``fedhmc sweep``, ``fedhmc experiment``
and the Python API (``fedhmc.runtime.engine.run(cfg)`` with ``threads`` left out) choose
the same way; a number given to any of them is used as it is.
"""

from __future__ import annotations

import contextlib
import os

from fedhmc.errors import ConfigError

AUTO_WORK = 10_000_000
"""Multiply-adds of one batched gradient evaluation (clients × chains × batch × parameters)
from which ``auto`` uses every core."""


def parse_threads(value: str | int | None) -> int | str | None:
    """``None``/``"auto"`` or a positive int (the ``--threads`` option's type)."""
    if value is None or value == "auto":
        return value
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise ConfigError(f"--threads must be a positive integer or 'auto', got {value!r}")
    cores = os.cpu_count() or 1
    if n > cores:
        raise ConfigError(
            f"--threads {n}: this machine has {cores} cores; use at most {cores} (or auto)"
        )
    return n


def gradient_work(num_clients: int, chains: int, batch: int, dim: int) -> int:
    """Multiply-adds of one batched gradient evaluation, roughly."""
    return num_clients * max(1, chains) * max(1, batch) * dim


def round_work(target, cfg) -> int:
    """Multiply-adds of one batched gradient evaluation of a round on ``target``, roughly:
    what ``--threads auto`` decides by, in the engine and in a Flower simulation's
    co-located clients alike (so that both compute with the same thread count)."""
    batch = int(getattr(target, "batch_size", 1) or 0)
    n_max = getattr(target, "max_client_size", None)  # not target.X: it may never be built
    if n_max is not None and (batch <= 0 or batch > n_max):
        batch = int(n_max)
    clients = min(target.num_clients, cfg.clients_per_round or target.num_clients)
    return gradient_work(clients, cfg.chains, batch, target.dim)


def auto_threads(work: int, cores: int | None = None) -> int:
    """The thread count ``auto`` picks for a gradient evaluation of ``work`` multiply-adds."""
    cores = cores or os.cpu_count() or 1
    return cores if work >= AUTO_WORK else 1


DEFAULT_THREADS = "auto"
"""What a run that names no thread count uses, from the command line and from Python alike
(``fedhmc run`` and ``run(RunConfig(...))`` compute with the same threads)."""

_default: int | str = DEFAULT_THREADS


def set_default_threads(threads: int | str | None) -> None:
    """What ``apply_threads`` does when a run names no thread count: the command line
    sets it once for every run it starts in its process (``--threads``); None restores
    ``DEFAULT_THREADS`` (``auto``)."""
    global _default
    parsed = parse_threads(threads)
    _default = DEFAULT_THREADS if parsed is None else parsed


def apply_threads(threads: int | str | None, work: int) -> int:
    """Set torch's intra-op threads for a gradient evaluation of ``work`` multiply-adds;
    returns the count. ``None`` means the process default: ``auto``, as ``fedhmc run``
    without ``--threads``, unless ``set_default_threads`` chose another."""
    import torch

    if threads is None:
        threads = _default
    if threads == "auto":
        threads = auto_threads(work)
    torch.set_num_threads(int(threads))
    return torch.get_num_threads()


@contextlib.contextmanager
def threads_restored():
    """Run the body, then give torch back the intra-op thread count it had before:
    ``fedhmc.run`` and ``engine.run`` set the count for their run only, and leave the
    caller's process as they found it (the one torch setting a run changes; its random
    state is saved and restored wherever a run seeds torch's global generator)."""
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
