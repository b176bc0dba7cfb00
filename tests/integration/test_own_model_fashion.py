"""docs/own-model.md's Fashion-MNIST example, run as the page writes it (on fewer images and
rounds): its module, its command line and its Python script, whose printed values must be
the ones its comments show. It needs the real Fashion-MNIST files and skips, saying how to
install them, without them."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "own-model.md"
SECTION = "## Fashion-MNIST with a module of your own"


def _section() -> str:
    page = PAGE.read_text(encoding="utf-8")
    assert SECTION in page, f"docs/own-model.md has no section {SECTION!r}"
    text = page.split(SECTION, 1)[1]
    return text.split("\n## ", 1)[0]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _section(), re.S)


def _one(blocks: list[str], marker: str) -> str:
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"{len(found)} code blocks of the section hold {marker!r}"
    return found[0]


def _cut(code: str, old: str, new: str) -> str:
    """``code`` with ``old`` (which must be there once) replaced: the page's example, smaller."""
    assert code.count(old) == 1, f"the example no longer holds {old!r}"
    return code.replace(old, new)


@pytest.fixture(scope="module")
def fashion():
    from fedhmc_datasets.registry import load_dataset

    from fedhmc.errors import DataError

    try:
        load_dataset("fashion-mnist", scaling="unit")
    except DataError as e:
        pytest.skip(
            "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist): "
            + str(e).splitlines()[0]
        )


def test_the_command_line_example_names_real_options_and_the_module(tmp_path, monkeypatch):
    from fedhmc.cli.main import build_parser
    from fedhmc.cli.options import config_from_args
    from fedhmc.models.loading import load_factory

    (tmp_path / "fmnist_nets.py").write_text(_one(_blocks("python"), "class FashionCNN"))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fmnist_nets", None)
    command = _one(_blocks("bash"), "fedhmc run").replace("\\\n", " ")
    argv = shlex.split(command)
    assert argv[0] == "fedhmc"
    cfg = config_from_args(build_parser().parse_args(argv[1:]))
    assert (cfg.dataset, cfg.model, cfg.batch_size) == (
        "fashion-mnist",
        "fmnist_nets:FashionCNN",
        100,
    )
    factory = load_factory(cfg.model)
    import torch

    out = factory(channels=8)(torch.zeros(3, 784))  # flat images, as the named data sets come
    assert out.shape == (3, 10)


def test_the_python_example_prints_what_its_comments_say(fashion, tmp_path):
    (tmp_path / "fmnist_nets.py").write_text(_one(_blocks("python"), "class FashionCNN"))
    script = _one(_blocks("python"), 'load_dataset("fashion-mnist"')
    small = _cut(_cut(script, "n = 6000", "n = 600"), "rounds=20", "rounds=2")
    (tmp_path / "example.py").write_text(small)
    p = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr[-3000:]
    printed = p.stdout.splitlines()
    said = re.findall(r"^print\(.*\)  # (.*)$", script, re.M)
    assert len(said) == 3 and printed[: len(said)] == said
    assert "accuracy" in printed[len(said)]
    assert (tmp_path / "runs" / "python-fmnist" / "summary.json").is_file()
