"""tools/replot_results.py: every committed results figure is redrawn from the files committed
next to it, by the experiment's own plotting function (into a copy, not over the docs)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def _tool():
    spec = importlib.util.spec_from_file_location(
        "replot_results", ROOT / "tools" / "replot_results.py"
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_every_committed_figure_has_a_redraw():
    with_figures = {p.parent.name for p in RESULTS.glob("*/*.png")}
    assert with_figures and with_figures <= set(_tool().FIGURES)


@pytest.mark.parametrize("name", sorted({p.parent.name for p in RESULTS.glob("*/*.png")}))
def test_each_figure_is_redrawn_from_the_committed_files(tmp_path, monkeypatch, name):
    tool = _tool()
    (tmp_path / name).mkdir()
    for f in (RESULTS / name).iterdir():
        if f.is_file():  # the tables and figures, not the cells
            shutil.copy(f, tmp_path / name / f.name)
            os.utime(tmp_path / name / f.name, ns=(0, 0))
    monkeypatch.setattr(tool, "RESULTS", tmp_path)
    paths = tool.FIGURES[name](name)
    assert {p.name for p in paths} == {p.name for p in (RESULTS / name).glob("*.png")}
    for p in paths:  # each one drawn anew, in the copy
        assert p.parent == tmp_path / name and p.stat().st_mtime_ns > 0
        assert p.read_bytes()[:4] == b"\x89PNG"
