"""Broken samplers from other packages (the entry-point group ``fedhmc.algorithms``): each
is named in one line on stderr and left out, the others still load, ``fedhmc --help``
still works, and a broken sampler's settings are a one-line refusal when it is run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ENTRIES = {
    "exits": "plug_exit:ENTRY",
    "interrupts": "plug_interrupt:ENTRY",
    "missing": "plug_not_there:ENTRY",
    "digits": "plug_entries:DIGITS",
    "option": "plug_entries:OPTION",
    "empty": "plug_entries:EMPTY",
    "not-an-entry": "plug_entries:NOT_AN_ENTRY",
    "fahmc-again": "plug_entries:TAKEN",
    "raises": "plug_entries:RAISES",
    "wrong-type": "plug_entries:WRONG_TYPE",
    "good": "plug_entries:GOOD",
}


def _install(folder: Path) -> dict:
    """A fake installed distribution declaring ``ENTRIES``, importable from ``folder``."""
    (folder / "plug_exit.py").write_text("import sys\nsys.exit(3)\n")
    (folder / "plug_interrupt.py").write_text("raise KeyboardInterrupt\n")
    (folder / "plug_raises.py").write_text(
        textwrap.dedent("""
        from dataclasses import dataclass

        from fedhmc.algorithms.fahmc import *  # noqa: F403 (FA-HMC's round)
        from fedhmc.algorithms import fahmc

        @dataclass(frozen=True)
        class Settings(fahmc.Settings):
            def check(self):
                raise RuntimeError("boom")
    """)
    )
    (folder / "plug_entries.py").write_text(
        textwrap.dedent("""
        from fedhmc.algorithms.registry import Entry

        kw = dict(module_path="fedhmc.algorithms.fahmc")
        DIGITS = Entry("123", **kw)
        OPTION = Entry("--rounds", **kw)
        EMPTY = Entry("", **kw)
        NOT_AN_ENTRY = {"name": "dict-sampler"}
        TAKEN = Entry("fahmc", **kw)
        RAISES = Entry("plug-raises", module_path="plug_raises")
        WRONG_TYPE = Entry("plug-wrong", kind="sometimes", **kw)
        GOOD = Entry("plug-good", **kw)
    """)
    )
    info = folder / "fedhmc_broken_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fedhmc-broken-plugins\nVersion: 0.1\n"
    )
    lines = "".join(f"{k} = {v}\n" for k, v in ENTRIES.items())
    (info / "entry_points.txt").write_text(f"[fedhmc.algorithms]\n{lines}")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}


def _fedhmc(env, *argv, cwd):
    return subprocess.run(
        [sys.executable, "-m", "fedhmc", *argv], env=env, cwd=cwd, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def plugged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugins")
    return _install(folder), folder


def test_help_works_and_names_each_broken_sampler_in_one_line(plugged):
    env, folder = plugged
    proc = _fedhmc(env, "run", "--help", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert "plug-good" in proc.stdout and "plug-raises" in proc.stdout
    assert "plug-wrong" not in proc.stdout
    notes = [ln for ln in proc.stderr.splitlines() if ln.startswith("fedhmc: sampler ")]
    want = {
        "plug_exit:ENTRY": "its import failed (SystemExit: 3)",
        "plug_interrupt:ENTRY": "its import failed (KeyboardInterrupt)",
        "plug_not_there:ENTRY": "its import failed (ModuleNotFoundError: ",
        "plug_entries:DIGITS": "its name '123' is not a sampler name",
        "plug_entries:OPTION": "its name '--rounds' is not a sampler name",
        "plug_entries:EMPTY": "its name '' is not a sampler name",
        "plug_entries:NOT_AN_ENTRY": "it is a dict, not an Entry",
        "plug_entries:TAKEN": "its name 'fahmc' is already listed",
        "plug_entries:WRONG_TYPE": "its kind 'sometimes' is not one of federated, pooled, ",
    }
    assert len(notes) == len(want), proc.stderr
    for value, why in want.items():
        assert any(n.startswith(f"fedhmc: sampler {value} not loaded: {why}") for n in notes), (
            value,
            notes,
        )
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "name, line",
    [("plug-raises", "--algorithm plug-raises: its Settings failed (RuntimeError: boom)")],
)
def test_a_broken_samplers_settings_are_one_line(plugged, name, line):
    env, folder = plugged
    proc = _fedhmc(
        env, "run", "--algorithm", name, "--rounds", "1", "--out", "r-" + name, cwd=folder
    )
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith("fedhmc: sampler ")]
    assert len(errors) == 1 and line in errors[0], proc.stderr
