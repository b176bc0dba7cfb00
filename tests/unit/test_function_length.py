"""Functions a reader can follow: no function of the library (``FOLDERS``: ``fedhmc``,
``datasets``, ``server`` and ``clients``) is longer than ``MAX_LINES`` lines
(``end_lineno - lineno + 1``: the signature, the docstring and the body; nested functions
and methods are measured on their own too) or takes more than ``MAX_PARAMS`` parameters
(every parameter but ``self`` and ``cls``, keyword-only and ``*args``/``**kwargs``
included), but for the public functions of ``WIDE_SIGNATURES``, whose keyword (and
positional) calls in the tests and the docs are kept as they are."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

MAX_LINES = 60
MAX_PARAMS = 8
ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("fedhmc", "datasets", "server", "clients")

WIDE_SIGNATURES = {
    # path:qualified name -> its parameter count, which stays for its callers' sake.
    "fedhmc/algorithms/mhmc.py:mhmc": 9,  # docs/samplers.md and the tests call it by keyword
    "fedhmc/analysis/gaussian.py:fahmc_gaussian_stationary": 10,  # positional in the tests
    "fedhmc/analysis/gaussian.py:fahmc_gaussian_transient": 11,  # positional in the tests
}


def _functions(tree: ast.AST):
    """Every function and method of ``tree`` (nested ones included), with its qualified
    name."""

    def walk(node: ast.AST, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return len([n for n in names if n not in ("self", "cls")])


def test_the_checked_folders_exist():
    for folder in FOLDERS:
        assert list((ROOT / folder).rglob("*.py")), f"no Python files in {folder}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_short_functions_with_few_parameters(folder):
    files = sorted((ROOT / folder).rglob("*.py"))
    offenders = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, node in _functions(tree):
            length = node.end_lineno - node.lineno + 1
            params = _parameters(node)
            if length > MAX_LINES:
                offenders.append(f"{rel}:{node.lineno} {name} {length} lines")
            if params > WIDE_SIGNATURES.get(f"{rel}:{name}", MAX_PARAMS):
                offenders.append(f"{rel}:{node.lineno} {name} {params} parameters")
    assert not offenders, (
        f"functions longer than {MAX_LINES} lines or with more than {MAX_PARAMS} parameters; "
        "split them, or group parameters that travel together:\n" + "\n".join(offenders)
    )


def test_wide_signatures_are_still_wide():
    """An entry of WIDE_SIGNATURES whose function shrank (or went) is removed, so that the
    exception list only names what needs it."""
    for key, allowed in WIDE_SIGNATURES.items():
        rel, name = key.split(":")
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        counts = [_parameters(node) for qual, node in _functions(tree) if qual == name]
        assert counts == [allowed], f"{key}: {counts}; update WIDE_SIGNATURES"
