"""Loops a reader can follow: no function of the runtime or the server is longer than
``MAX_LINES`` lines (``end_lineno - lineno + 1``: the signature, the docstring and the body;
nested functions and methods are measured on their own too)."""

from __future__ import annotations

import ast
from pathlib import Path

MAX_LINES = 60
ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("fedhmc/runtime", "server")


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


def _too_long() -> list[str]:
    offenders = []
    for folder in CHECKED:
        for path in sorted((ROOT / folder).glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for name, node in _functions(tree):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_LINES:
                    rel = path.relative_to(ROOT).as_posix()
                    offenders.append(f"{rel}:{node.lineno} {name} {length}")
    return offenders


def test_the_checked_folders_exist():
    for folder in CHECKED:
        assert list((ROOT / folder).glob("*.py")), f"no Python files in {folder}"


def test_no_function_is_longer_than_the_limit():
    offenders = _too_long()
    assert not offenders, (
        f"functions longer than {MAX_LINES} lines (path:line name length); split them:\n"
        + "\n".join(offenders)
    )
