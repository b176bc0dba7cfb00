"""A module planted on ``sys.path`` that leaves a file when it is imported or called: what
a run folder must never make fedhmc import (the tests of issues 44 and 47)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

NAME = "fedhmc_planted"


@contextlib.contextmanager
def planted_module(tmp_path: Path, monkeypatch, source: str):
    """Module ``NAME`` written from ``source`` (its ``{marker}`` filled in with the path of
    the file it leaves) and importable while the block runs; yields that path."""
    marker = tmp_path / "side-effect"
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / f"{NAME}.py").write_text(source.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(pkg))
    try:
        yield marker
    finally:
        sys.modules.pop(NAME, None)
