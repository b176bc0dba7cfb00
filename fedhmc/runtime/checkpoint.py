"""Checkpoints of a run: everything it needs to continue, written atomically.

A run directory holds ``checkpoint.pt`` (the newest) and ``checkpoint.prev.pt`` (the one
before). Each file is one JSON header line (format, package version, round, the payload's
length and SHA-256) followed by the payload, a ``torch.save`` of plain data: tensors,
numbers, strings, lists and dicts. The write goes to a temporary file that is flushed and
fsync'ed, the previous checkpoint is renamed to ``checkpoint.prev.pt``, and the new one is
renamed into place. A ``kill -9`` at any moment therefore leaves at least one complete
checkpoint. A truncated or corrupted file fails its checksum, and :func:`load` falls back
to the previous one.

Nothing random needs saving: every random number fedhmc draws is a function of the run
seed, the round and counters (:mod:`fedhmc.core.rng`), so the state is the positions, the
carried momenta, the streaming accumulators and the round reached.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import torch

from fedhmc import __version__
from fedhmc.errors import ConfigError

FORMAT = 1
NAME = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"


def save(run_dir: str | os.PathLike, state: dict) -> Path:
    """Write ``state`` (plain data and tensors) as the run's newest checkpoint."""
    run_dir = Path(run_dir)
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = {
        "format": FORMAT,
        "version": __version__,
        "round": int(state.get("round", 0)),
        "bytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    tmp = run_dir / (NAME + ".tmp")
    with open(tmp, "wb") as f:
        f.write(json.dumps(header).encode() + b"\n")
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    path = run_dir / NAME
    if path.exists():
        os.replace(path, run_dir / PREVIOUS)
    os.replace(tmp, path)
    try:  # make the renames durable
        fd = os.open(run_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on a directory
        pass
    return path


def _read(path: Path) -> dict:
    with open(path, "rb") as f:
        header = json.loads(f.readline())
        payload = f.read()
    if header.get("format") != FORMAT:
        raise ValueError(f"format {header.get('format')}")
    if len(payload) != header["bytes"]:
        raise ValueError(f"truncated ({len(payload)} of {header['bytes']} bytes)")
    if hashlib.sha256(payload).hexdigest() != header["sha256"]:
        raise ValueError("checksum mismatch")
    state = torch.load(io.BytesIO(payload), weights_only=True)
    state["_header"] = header
    state["_file"] = path.name
    return state


def load(run_dir: str | os.PathLike) -> tuple[dict, list[str]]:
    """The newest valid checkpoint of ``run_dir`` and the problems met on the way.

    Raises
    ------
    ConfigError
        When the directory holds no readable checkpoint.
    """
    run_dir = Path(run_dir)
    problems = []
    for name in (NAME, PREVIOUS):
        path = run_dir / name
        if not path.exists():
            continue
        try:
            return _read(path), problems
        except (OSError, ValueError, RuntimeError, KeyError, EOFError) as e:
            problems.append(f"{name} is unusable ({e})")
    why = "; ".join(problems) if problems else "no checkpoint.pt"
    raise ConfigError(
        f"cannot resume from {str(run_dir)!r}: {why}; run it again without --resume "
        "(add --overwrite to replace it)"
    )


# Settings that may differ between a checkpoint and the run that continues it.
RESUMABLE_CHANGES = frozenset({"rounds", "out", "resume", "overwrite", "checkpoint_every"})


def check_compatible(saved: dict, config: dict, version: str) -> None:
    """Refuse to continue a checkpoint under another configuration or package version."""
    if version != __version__:
        raise ConfigError(
            f"the checkpoint was written by fedhmc {version}, this is {__version__}; "
            "continue it with that version, or start the run again"
        )
    for key in sorted(set(saved) | set(config)):
        if key in RESUMABLE_CHANGES or key.startswith("_"):
            continue
        a, b = saved.get(key), config.get(key)
        if a != b and not (_nan(a) and _nan(b)):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(
                f"cannot resume: {flag} was {a!r} in the checkpoint and is {b!r} now; "
                f"drop {flag} (only --rounds may change) or start a new run"
            )
    if int(config["rounds"]) < int(saved.get("_round_reached", 0)):
        raise ConfigError(
            f"cannot resume: the run already reached round {saved['_round_reached']}, "
            f"more than --rounds {config['rounds']}"
        )


def _nan(x) -> bool:
    return isinstance(x, float) and x != x
