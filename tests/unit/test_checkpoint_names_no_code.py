"""A checkpoint names no code: nested state types come from the State classes' declared
fields, never from the file.

Tried as an attacker would: a checkpoint edited (its checksum recomputed) so that a state
names an importable module with a side effect. The resume must be refused in one line,
exit 2, with the module never imported and the run's files untouched.
"""

from __future__ import annotations

import sys

import pytest
from planted_module import planted_module

from fedhmc.algorithms import fahmc
from fedhmc.cli import main
from fedhmc.errors import ConfigError
from fedhmc.runtime import checkpoint

EVIL = """
from pathlib import Path
Path({marker!r}).write_text("imported")


class State:
    def __init__(self, **kw):
        Path({marker!r}).write_text("called")
"""


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A finished 3-round run, and an importable module that leaves a file when imported."""
    run = tmp_path / "run"
    assert main(["run", "--rounds", "3", "--chains", "2", "--quiet", "--out", str(run)]) == 0
    with planted_module(tmp_path, monkeypatch, EVIL) as marker:
        yield run, marker


def _tamper(run, edit) -> None:
    state, _ = checkpoint.load(run)
    state = {k: v for k, v in state.items() if not k.startswith("_")}
    edit(state["backend"])
    checkpoint.save(run, state)  # a valid file: its checksum recomputed
    (run / checkpoint.PREVIOUS).unlink(missing_ok=True)


def _files(run) -> dict:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}


@pytest.mark.parametrize(
    "edit",
    [
        # a nested state where the field holds a tensor
        lambda b: b["fields"].update(momentum={"type": "fedhmc_planted.State", "fields": {}}),
        # the state itself
        lambda b: b.update(type="fedhmc_planted.State"),
        # inside a container
        lambda b: b["fields"].update(origin=[{"type": "fedhmc_planted.State", "fields": {}}]),
        # a field this version does not declare
        lambda b: b["fields"].update(payload={"type": "fedhmc_planted.State", "fields": {}}),
    ],
    ids=["nested", "top", "in-a-list", "unknown-field"],
)
def test_a_checkpoint_naming_a_module_is_refused_and_never_imports_it(planted, edit, capsys):
    run, marker = planted
    _tamper(run, edit)
    before = _files(run)
    capsys.readouterr()
    code = main(["run", "--resume", str(run), "--rounds", "5", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "cannot resume" in err, err
    assert not marker.exists(), "the planted module ran"
    assert "fedhmc_planted" not in sys.modules
    assert _files(run) == before, "a refused resume changed the run's files"


def test_declared_nested_states_still_round_trip():
    """A State whose field is declared as another State reads back (the type comes from
    the declaration; the file's name for it must agree)."""
    from dataclasses import dataclass

    import torch

    inner = fahmc.State(torch.ones(2, 3), 4)

    @dataclass(frozen=True)
    class Outer:
        inner: fahmc.State | None
        count: int = 0

    Outer.__module__, Outer.__qualname__ = __name__, "Outer"
    saved = checkpoint.state_dict(Outer(inner, 7))
    back = checkpoint.state_from_dict(saved, Outer)
    assert back.count == 7 and back.inner.round == 4
    assert torch.equal(back.inner.position, inner.position)
    saved["fields"]["inner"]["type"] = "fedhmc.algorithms.debiased.State"
    with pytest.raises(ConfigError, match="holds no such state"):
        checkpoint.state_from_dict(saved, Outer)
