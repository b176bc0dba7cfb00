"""A virtual environment that sees this one's packages except those hidden: a lent GPU
machine's conditions (torch and its companions, no Flower, no Ray, no fedhmc install), made
here in a second, without downloading anything.

    python tools/bare_env.py DIR [--hide flwr ray fedhmc]
    DEVICE=cpu SMOKE=1 PYTHON=DIR/bin/python bash tools/gpu_check.sh

DIR gets a venv without pip whose site-packages holds one ``.pth`` line naming
``DIR/packages``: a symbolic link to each top-level entry of this interpreter's
site-packages, except the hidden distributions' (their import names, metadata and
editable-install hooks), so that ``import flwr`` fails there as on the GPU machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
from pathlib import Path

HIDE = ("flwr", "ray", "fedhmc")


def hidden(name: str, hide: tuple[str, ...]) -> bool:
    """Whether a site-packages entry belongs to a hidden distribution (or is a ``.pth``)."""
    base = name.lower().replace("-", "_")
    if base.endswith(".pth") or base.startswith(("__editable__", "_virtualenv")):
        return True
    return any(base == h or base.startswith((f"{h}.", f"{h}_", f"{h}-")) for h in hide)


def make(folder: Path, hide: tuple[str, ...] = HIDE) -> Path:
    """The bare environment in ``folder``; returns its Python."""
    venv = [sys.executable, "-m", "venv", "--without-pip", "--clear", str(folder)]
    subprocess.run(venv, check=True)
    packages = folder / "packages"
    packages.mkdir()
    for site in dict.fromkeys((sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])):
        for entry in sorted(Path(site).iterdir()):
            if not hidden(entry.name, hide) and not (packages / entry.name).exists():
                (packages / entry.name).symlink_to(entry)
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "bare.pth").write_text(f"{packages}\n")
    return python


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tools/bare_env.py", description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--hide", nargs="+", default=list(HIDE), help="distributions to hide")
    args = ap.parse_args(argv)
    print(make(args.folder, tuple(args.hide)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
