"""Copy what ``flwr run`` ships of this repository into a small folder; print its path.

``flwr run DIR`` walks every file under DIR before it applies the app's ``fab-include``
patterns, so run from the repository root it also walks a virtual environment kept there
(tens of thousands of files: seconds on every submission). The app is the same when built
from a folder holding only ``pyproject.toml`` and the files that ``fab-include`` names, so
``deploy/run.sh`` and ``deploy/simulate.sh`` submit such a copy.

    python deploy/stage_app.py [DEST]     # DEST: a new or empty folder (default: a temp one)
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: Flower's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def shipped_files(root: Path = ROOT) -> list[Path]:
    """pyproject.toml and every file ``[tool.flwr.app] fab-include`` matches, relative."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    patterns = config["tool"]["flwr"]["app"].get("fab-include")
    if not patterns:
        raise SystemExit("pyproject.toml sets no [tool.flwr.app] fab-include; nothing to stage")
    files = {Path("pyproject.toml")}
    for pattern in patterns:
        for p in root.glob(pattern):
            if p.is_file() and "__pycache__" not in p.parts:
                files.add(p.relative_to(root))
    return sorted(files)


def stage(dest: Path | None = None, root: Path = ROOT) -> Path:
    """Copy `shipped_files` into ``dest`` (created) and return it."""
    dest = Path(dest) if dest else Path(tempfile.mkdtemp(prefix="fedhmc-app-"))
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise SystemExit(f"{dest} is not empty; give a new or empty folder")
    for rel in shipped_files(root):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)
    return dest


if __name__ == "__main__":
    print(stage(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
