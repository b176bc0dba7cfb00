"""Each top-level name is defined once across the library (fedhmc/, server/, clients/,
datasets/): a function, class or assignment at module level names one thing, so that a
reader (or a grep) finding ``build_model`` or ``summarize`` finds the one they meant.

The check reads the sources (ast) and imports none of them. An import is not a definition
(re-exports and ``from x import A as B`` are fine), nor is anything in an ``__init__.py``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("fedhmc", "server", "clients", "datasets")

INTERFACE = {
    # The algorithm interface: every algorithm module defines these by design.
    "Settings": "an algorithm's settings (every algorithm module)",
    "State": "an algorithm's state between calls of step (every algorithm module)",
    "Info": "what one step did (every algorithm module)",
    "init": "an algorithm's init(position, settings) (every algorithm module)",
    "step": "an algorithm's step(seed, state, target, settings) (every algorithm module)",
    "broadcast": "a federated algorithm's server message (fahmc, debiased)",
    "client_update": "a federated algorithm's client computation (fahmc, debiased)",
    "server_update": "a federated algorithm's server update (fahmc, debiased)",
    "kept_by_client": "what a federated algorithm's clients kept, as client_update reads it",
    "client_keeps": "what a federated algorithm's clients keep of a round (the interface)",
    "combination": "a federated algorithm's rule for combining replies (the interface)",
    "layout": "a federated algorithm's message arrays (fahmc, debiased; wire dispatches)",
    "skip": "a federated algorithm's round without a client (the federated interface)",
    "MESSAGE": "a federated algorithm's message arrays by wire name (fedhmc.algorithms.api)",
    "MESSAGE_VALUES": "a federated algorithm's message scalars by wire name",
    "REPLY": "a federated algorithm's reply arrays by wire name (fedhmc.algorithms.api)",
    "REPLY_BITS": "the bits a federated algorithm's compressed reply arrays take",
    "Broadcast": "a federated algorithm's round message (the wire builds it by name)",
    "Combination": "how a federated algorithm's replies combine (its combination's value)",
    "setup_rounds": "a federated algorithm's set-up phase (fsgld)",
    "resumes_on_flower": "whether a federated algorithm's clients' state survives new nodes",
    "NO_PARTIAL_REASON": "why a sampler has no --clients-per-round (read by its registry entry)",
    "PROTOCOLS": "the --protocol values a sampler runs under (read by its registry entry)",
    "ClientUpdate": "a federated algorithm's reply (the wire builds it by name)",
    # The app interface: Flower and the command line look these names up.
    "app": "a Flower ServerApp / ClientApp object (server/app.py, clients/app.py)",
    "main": "a command's entry point (python -m …)",
    # Per-module loggers.
    "log": "a module's own logger",
    "logger": "a module's own logger",
}
"""Names defined in several modules on purpose, each with the reason."""


def top_level_names(tree: ast.Module) -> set[str]:
    """The names a module defines at top level (functions, classes, assignments), also
    inside top-level ``if`` / ``try`` blocks; imports are not definitions."""
    names: set[str] = set()

    def visit(body) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return names


def exempt(name: str) -> bool:
    return name.startswith("_") or name in INTERFACE  # private, dunder, __all__ included


def duplicates(sources: dict[str, str]) -> dict[str, list[str]]:
    """Name → the modules (paths) that define it, for every name defined in two or more
    of ``sources`` (path → text; ``__init__.py`` files are skipped)."""
    where: dict[str, list[str]] = defaultdict(list)
    for path, text in sorted(sources.items()):
        if Path(path).name == "__init__.py":
            continue
        for name in top_level_names(ast.parse(text, filename=path)):
            if not exempt(name):
                where[name].append(path)
    return {n: ps for n, ps in sorted(where.items()) if len(ps) > 1}


def library_sources() -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
        for folder in FOLDERS
        for p in sorted((ROOT / folder).rglob("*.py"))
    }


def test_each_top_level_name_is_defined_once():
    found = duplicates(library_sources())
    assert not found, "defined in more than one module (rename one):\n" + "\n".join(
        f"  {name}: {', '.join(paths)}" for name, paths in found.items()
    )


def test_the_check_finds_a_name_defined_twice():
    sources = {
        "a/x.py": "def build_model(): ...\nDATASETS = ()\n_private = 1\nlog = None\n",
        "a/y.py": "class build_model: ...\nif True:\n    DATASETS: tuple = ()\n_private = 2\n",
        "a/z.py": "from a.x import build_model\nlog = None\ndef step(): ...\n",
        "a/__init__.py": "DATASETS = ()\n",
        "a/w.py": "def step(): ...\n__all__ = []\n",
    }
    assert duplicates(sources) == {"DATASETS": ["a/x.py", "a/y.py"],
                                   "build_model": ["a/x.py", "a/y.py"]}  # fmt: skip
