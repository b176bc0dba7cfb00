"""The architecture, enforced: every module imports only from its own layer or the layers
below it, the module graph has no cycles (function-level imports included), and only the
Flower layer imports flwr."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "fedhmc": "fedhmc",
    "datasets": "fedhmc_datasets",
    "server": "fedhmc_server",
    "clients": "fedhmc_clients",
}

# Lowest first. A module may import from its own layer and from any layer listed before it.
LAYERS = [
    ("errors", ["fedhmc.errors"]),
    ("core", ["fedhmc.core"]),
    ("data", ["fedhmc_datasets"]),
    ("models", ["fedhmc.models"]),
    ("analysis", ["fedhmc.analysis"]),
    ("algorithms", ["fedhmc.algorithms"]),
    ("runtime", ["fedhmc.runtime"]),
    ("flower clients", ["fedhmc_clients"]),
    ("flower server", ["fedhmc_server"]),
    ("sweep", ["fedhmc.sweep"]),
    ("viz", ["fedhmc.viz"]),
    ("experiments", ["fedhmc.experiments"]),
    ("cli", ["fedhmc.cli"]),
    # fedhmc/__init__.py and __main__.py
    ("package", ["fedhmc"]),
]


def rank(module: str) -> int:
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best


def modules() -> dict[str, Path]:
    out = {}
    for folder, name in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([name, *parts])] = path
    return out


def imports(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """Every fedhmc module that ``module`` imports, at any depth of the file."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            # the longest known module that n names (a submodule or the module itself)
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n:
                found.append((n, node.lineno))
    return found


MODULES = modules()
GRAPH = {
    m: sorted({n for n, _ in imports(m, p, set(MODULES)) if n != m}) for m, p in MODULES.items()
}


def test_every_module_has_a_layer():
    for m in MODULES:
        rank(m)


def test_imports_only_go_down():
    bad = []
    for m, path in MODULES.items():
        for n, line in imports(m, path, set(MODULES)):
            if n == m or n == "fedhmc":
                continue  # a package's own __init__ (lazy public API) is not a layer edge
            if rank(n) > rank(m):
                bad.append(
                    f"{path.relative_to(ROOT)}:{line}: {m} ({LAYERS[rank(m)][0]}) imports "
                    f"{n} ({LAYERS[rank(n)][0]})"
                )
    assert not bad, "imports that go up a layer:\n" + "\n".join(bad)


def test_data_layer_imports_only_errors_from_fedhmc():
    bad = [
        f"{m} imports {n}"
        for m in MODULES
        if m.startswith("fedhmc_datasets")
        for n in GRAPH[m]
        if n.startswith("fedhmc.") and n != "fedhmc.errors"
    ]
    assert not bad, bad


def test_no_import_cycles():
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in GRAPH[m]:
            if n == "fedhmc" or n.startswith(m + "."):
                continue  # a package importing its own submodules (re-exports)
            if state.get(n) == 1:
                cycles.append(" -> ".join(stack[stack.index(n) :] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_flower_layer_imports_flwr(module):
    if module.startswith(("fedhmc_server", "fedhmc_clients")):
        return
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] == "flwr" for a in node.names), module
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.module.split(".")[0] != "flwr", module


def test_the_rules_can_fail():
    """The checker itself: an upward import and a cycle are caught."""
    assert rank("fedhmc.core.rng") < rank("fedhmc.runtime.engine")
    assert rank("fedhmc_datasets.mnist") < rank("fedhmc.models.targets")
    assert rank("fedhmc.cli.main") > rank("fedhmc_server.app")


def test_the_earlier_module_names_are_gone():
    """One name per thing: the flat layout's re-exporting modules no longer exist."""
    import importlib.util

    for old in ("fedhmc.config", "fedhmc.engine", "fedhmc.sampler", "fedhmc.targets"):
        assert importlib.util.find_spec(old) is None, old
