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
    (folder / "plug_entries.py").write_text(
        textwrap.dedent("""
        from fedhmc.algorithms import fahmc
        from fedhmc.algorithms.registry import Entry, fahmc_settings

        def _raise(cfg):
            raise RuntimeError("boom")

        kw = dict(module_path="fedhmc.algorithms.fahmc", leapfrog=True)
        DIGITS = Entry("123", settings=fahmc_settings, **kw)
        OPTION = Entry("--rounds", settings=fahmc_settings, **kw)
        EMPTY = Entry("", settings=fahmc_settings, **kw)
        NOT_AN_ENTRY = {"name": "dict-sampler"}
        TAKEN = Entry("fahmc", settings=fahmc_settings, **kw)
        RAISES = Entry("plug-raises", settings=_raise, **kw)
        WRONG_TYPE = Entry("plug-wrong", settings=lambda cfg: 5, **kw)
        GOOD = Entry("plug-good", settings=fahmc_settings, **kw)
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
    [
        (
            "plug-raises",
            "--algorithm plug-raises: its settings(config) failed (RuntimeError: boom)",
        ),
        ("plug-wrong", "--algorithm plug-wrong: its settings(config) returned a value of type int"),
    ],
)
def test_a_broken_samplers_settings_are_one_line(plugged, name, line):
    env, folder = plugged
    proc = _fedhmc(
        env, "run", "--algorithm", name, "--rounds", "1", "--out", "r-" + name, cwd=folder
    )
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith("fedhmc: sampler ")]
    assert len(errors) == 1 and line in errors[0], proc.stderr
