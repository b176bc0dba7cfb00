"""How much memory the machine has free, and a one-line refusal when a run or a data file
needs more.

A run that asks for more memory than the machine has does not fail cleanly: the kernel
kills the process (no message at all) or an allocation fails deep inside torch. So the
data loaders and the run check their needs against what is free before they allocate,
and refuse in one line that names both amounts and the fix.

``available_bytes(device)`` is the memory a new allocation can take without swapping:
on the CPU the kernel's ``MemAvailable`` (bounded by the process's cgroup limit, where one
is set); on a CUDA device the free memory that ``torch.cuda.mem_get_info`` reports. It is
None where it cannot be known (then nothing is refused).
"""

from __future__ import annotations

import os

from fedhmc.errors import ConfigError

_CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
    (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",  # cgroup v1
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    ),
)


def format_bytes(n: float) -> str:
    """``n`` bytes as people read them: ``512 B``, ``3.2 MB``, ``7.5 GB`` (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return None
        return max(int(limit) - usage, 0)
    return None


def available_host_bytes() -> int | None:
    """Memory a new allocation on the CPU can take now (None: unknown)."""
    known = [b for b in (_meminfo_available(), _cgroup_available()) if b is not None]
    return min(known) if known else None


def available_device_bytes(device) -> int | None:
    """Free memory of a CUDA ``device`` (None for the CPU, other devices, or unknown)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    try:
        return int(torch.cuda.mem_get_info(dev)[0])
    except (RuntimeError, AssertionError, ValueError):  # no driver, no such device
        return None


def available_bytes(device="cpu") -> int | None:
    """Memory free where ``device`` computes: the host's for ``cpu``, the GPU's for CUDA."""
    import torch

    if torch.device(device).type == "cpu":
        return available_host_bytes()
    return available_device_bytes(device)


def require(need: int, device, what: str, fix: str, error=ConfigError) -> None:
    """Raise ``error`` (one line) when ``need`` bytes exceed what is free on ``device``.

    ``what`` names the need (``"the run"``, ``"data.npz"``) and ``fix`` says how to need
    less; nothing is refused where the free memory cannot be known.
    """
    import torch

    have = available_bytes(device)
    if have is None or need <= have:
        return
    where = "this machine" if torch.device(device).type == "cpu" else str(device)
    raise error(
        f"{what} needs about {format_bytes(need)} of memory, more than the "
        f"{format_bytes(have)} free on {where}; {fix}"
    )


OUT_OF_MEMORY_TEXT = ("out of memory", "not enough memory", "cannot allocate memory")
"""What torch's and the C library's allocation failures say (RuntimeError's message)."""


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure: ``MemoryError``, ``torch.OutOfMemoryError``,
    or a ``RuntimeError`` whose message says that memory ran out."""
    if isinstance(exc, MemoryError):
        return True
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    if oom and isinstance(exc, oom):
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return any(t in text for t in OUT_OF_MEMORY_TEXT)
    return False


def out_of_memory_detail(exc: BaseException) -> str:
    """The first line of an allocation failure's message, shortened: what it tried."""
    text = (str(exc).strip().splitlines() or [""])[0]
    if not text:
        return type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


__all__ = [
    "available_bytes",
    "available_device_bytes",
    "available_host_bytes",
    "format_bytes",
    "is_out_of_memory",
    "out_of_memory_detail",
    "require",
]
