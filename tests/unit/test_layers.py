"""The architecture, enforced: every module imports only from its own layer or the layers
below it, the module graph has no cycles (function-level imports included), no module
imports another of this repository by a string (which the graph would not see), only the
Flower layer imports flwr, and the tools beside the library (benchmarks/, deploy/) edit
nothing on sys.path.

The check reads the sources (ast) and imports none of them. Each rule is a function of a
set of parsed sources, so that the tests at the end can feed it made-up modules and see
it fail.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "fedhmc": "fedhmc",
    "datasets": "fedhmc_datasets",
    "server": "fedhmc_server",
    "clients": "fedhmc_clients",
    "benchmarks": "benchmarks",
    "deploy": "deploy",
}
# Folders of scripts (python deploy/faults.py): the script's folder is first on the path,
# so a module there imports its siblings by their bare names (from loopback import …).
SCRIPT_FOLDERS = {"deploy"}
# The tools beside the library: no sys.path edits in them.
TOOLS = ("benchmarks", "deploy")
# Who may import flwr: the Flower layer, and the bare Flower app of the deploy benchmark.
FLWR_ALLOWED = ("fedhmc_server", "fedhmc_clients", "benchmarks.echo_app")

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
    # fedhmc/runner.py: sends a run to its backend (the engine, or the Flower server above).
    ("runner", ["fedhmc.runner"]),
    ("sweep", ["fedhmc.sweep"]),
    ("viz", ["fedhmc.viz"]),
    ("experiments", ["fedhmc.experiments"]),
    ("cli", ["fedhmc.cli"]),
    # fedhmc/__init__.py and __main__.py
    ("package", ["fedhmc"]),
    # The tools: the deployment recipe's Python helpers, then the benchmark (which deploys).
    ("deploy", ["deploy"]),
    ("benchmarks", ["benchmarks"]),
]


@dataclass(frozen=True)
class Source:
    """One module: its dotted name, its file (for messages) and its syntax tree."""

    name: str
    path: str
    tree: ast.Module
    is_pkg: bool = False
    script: bool = False  # imports its siblings by bare name


def source(name: str, text: str, path: str = "", is_pkg: bool = False) -> Source:
    """A module from its text; ``path`` defaults to the file its name suggests."""
    folder = next((f for f, n in FOLDERS.items() if name.split(".")[0] == n), "")
    path = path or name.replace(".", "/") + ("/__init__.py" if is_pkg else ".py")
    return Source(name, path, ast.parse(text, path), is_pkg, folder in SCRIPT_FOLDERS)


def load(root: Path = ROOT) -> dict[str, Source]:
    """Every module of FOLDERS under ``root``, by dotted name."""
    out = {}
    for folder, name in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            dotted = ".".join([name, *parts])
            out[dotted] = source(
                dotted, path.read_text(), str(path.relative_to(root)), path.name == "__init__.py"
            )
    return out


def rank(module: str) -> int:
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best


def imports(src: Source, known: set[str]) -> list[tuple[str, int]]:
    """Every known module that ``src`` imports, at any depth of the file, with its line."""
    package = src.name.rpartition(".")[0]
    found: dict[tuple[str, int], None] = {}  # in order, once each
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = src.name.split(".") if src.is_pkg else src.name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if src.script and package and f"{package}.{n.split('.')[0]}" in known:
                n = f"{package}.{n}"  # a sibling script, imported by its bare name
            # the longest known module that n names (a submodule or the module itself)
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n:
                found[n, node.lineno] = None
    return list(found)


def graph(sources: dict[str, Source]) -> dict[str, list[str]]:
    known = set(sources)
    return {m: sorted({n for n, _ in imports(s, known) if n != m}) for m, s in sources.items()}


# ------------------------------------------------------------------------------ the rules
def upward_imports(sources: dict[str, Source]) -> list[str]:
    """Imports that go up a layer, one line each."""
    bad = []
    for m, src in sources.items():
        for n, line in imports(src, set(sources)):
            if n == m or n == "fedhmc":
                continue  # a package's own __init__ (lazy public API) is not a layer edge
            if rank(n) > rank(m):
                bad.append(
                    f"{src.path}:{line}: {m} ({LAYERS[rank(m)][0]}) imports "
                    f"{n} ({LAYERS[rank(n)][0]})"
                )
    return bad


def import_cycles(sources: dict[str, Source]) -> list[str]:
    """Every cycle of the module graph (function-level imports included), as a -> b -> a."""
    edges = graph(sources)
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in edges[m]:
            if n == "fedhmc" or n.startswith(m + "."):
                continue  # a package importing its own submodules (re-exports)
            if state.get(n) == 1:
                cycles.append(" -> ".join(stack[stack.index(n) :] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sources:
        if m not in state:
            visit(m)
    return cycles


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def flwr_imports(src: Source) -> list[str]:
    """Imports of flwr in a module outside FLWR_ALLOWED."""
    if _under(src.name, FLWR_ALLOWED):
        return []
    bad = []
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods = [node.module]
        else:
            continue
        bad += [f"{src.path}:{node.lineno}: imports {m}" for m in mods if m.split(".")[0] == "flwr"]
    return bad


_BY_NAME = {"import_module", "__import__"}


def _module_named(text: str, known: set[str]) -> str | None:
    """The module of this repository that ``text`` names as a whole (``a.b``, ``a.b.attr``
    or ``a.b:attr``), or None; the bare ``fedhmc`` (a logger's or a program's name) is
    none."""
    dotted = text.partition(":")[0]
    if not dotted.replace(".", "").replace("_", "").isalnum() or dotted.startswith("."):
        return None
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted if dotted and dotted != "fedhmc" else None


def string_imports(src: Source, known: set[str]) -> list[str]:
    """Imports that the module graph cannot see: ``importlib.import_module(...)`` or
    ``__import__(...)`` of a module of this repository named by a literal, and any other
    string (docstrings aside) that names a module of a higher layer, such as a table of
    modules to import by name (``{"flower": "fedhmc_server.simulation"}``)."""
    skipped = {
        id(node.value)
        for node in ast.walk(src.tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }  # docstrings, of modules, classes, functions and attributes
    bad = []
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            arg = node.args[0]
            if name in _BY_NAME and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if _module_named(arg.value, known) is not None:
                    bad.append(f"{src.path}:{node.lineno}: {name}({arg.value!r})")
                    skipped.add(id(arg))  # said once
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            n = None if id(node) in skipped else _module_named(node.value, known)
            if n is not None and rank(n) > rank(src.name):
                bad.append(
                    f"{src.path}:{node.lineno}: {node.value!r} names {n} "
                    f"({LAYERS[rank(n)][0]}), a higher layer"
                )
    return bad


_PATH_METHODS = {"insert", "append", "extend", "remove", "pop", "clear"}


def path_edits(src: Source) -> list[str]:
    """Changes to sys.path in a module of TOOLS: a call of its list methods, an assignment
    to it or to an item or slice of it, a del, or site.addsitedir."""
    if not _under(src.name, TOOLS):
        return []
    sys_names, path_names, site_names = set(), set(), set()
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "sys":
                    sys_names.add(a.asname or "sys")
                elif a.name == "site":
                    site_names.add(a.asname or "site")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and not node.level:
            path_names |= {a.asname or a.name for a in node.names if a.name == "path"}

    def is_path(node) -> bool:
        if isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Attribute) and node.attr == "path":
            return isinstance(node.value, ast.Name) and node.value.id in sys_names
        return isinstance(node, ast.Name) and node.id in path_names

    bad = []
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr in _PATH_METHODS and is_path(f.value):
                bad.append(f"{src.path}:{node.lineno}: sys.path.{f.attr}(…)")
            elif (
                f.attr == "addsitedir"
                and isinstance(f.value, ast.Name)
                and f.value.id in site_names
            ):
                bad.append(f"{src.path}:{node.lineno}: site.addsitedir(…)")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            if any(is_path(t) for t in targets):
                bad.append(f"{src.path}:{node.lineno}: sys.path changed")
    return bad


# ------------------------------------------------------------------------------ this repository
SOURCES = load()


def test_every_module_has_a_layer():
    for m in SOURCES:
        rank(m)


def test_the_tools_are_checked_too():
    assert {"benchmarks.suite", "benchmarks.deploy", "deploy.faults", "deploy.loopback"} <= set(
        SOURCES
    )
    assert "deploy.loopback" in graph(SOURCES)["deploy.faults"]  # a bare sibling import
    assert "deploy.loopback" in graph(SOURCES)["benchmarks.deploy"]


def test_imports_only_go_down():
    bad = upward_imports(SOURCES)
    assert not bad, "imports that go up a layer:\n" + "\n".join(bad)


def test_data_layer_imports_only_errors_from_fedhmc():
    edges = graph(SOURCES)
    bad = [
        f"{m} imports {n}"
        for m in SOURCES
        if m.startswith("fedhmc_datasets")
        for n in edges[m]
        if n.startswith("fedhmc.") and n != "fedhmc.errors"
    ]
    assert not bad, bad


def test_no_import_cycles():
    cycles = import_cycles(SOURCES)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_module_imports_another_by_a_string():
    """A backend, say, is imported with an import statement where a run needs it (as
    fedhmc.runner does), never by its name from a layer below it."""
    bad = [line for src in SOURCES.values() for line in string_imports(src, set(SOURCES))]
    assert not bad, "imports by a string (use an import statement):\n" + "\n".join(bad)


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_only_the_flower_layer_imports_flwr(module):
    bad = flwr_imports(SOURCES[module])
    assert not bad, "\n".join(bad)


def test_the_tools_edit_nothing_on_sys_path():
    bad = [line for src in SOURCES.values() for line in path_edits(src)]
    assert not bad, "sys.path edits (run the tool from the repository root instead):\n" + "\n".join(
        bad
    )


# ------------------------------------------------------------------------------ the rules can fail
def test_the_layer_order_itself():
    assert rank("fedhmc.core.rng") < rank("fedhmc.runtime.engine")
    assert rank("fedhmc_datasets.mnist") < rank("fedhmc.models.targets")
    assert rank("fedhmc.cli.main") > rank("fedhmc_server.app")
    assert rank("fedhmc.runtime.engine") < rank("fedhmc_server.simulation")
    assert rank("fedhmc_server.simulation") < rank("fedhmc.runner") < rank("fedhmc.sweep.cells")
    assert rank("fedhmc.cli.main") < rank("deploy.loopback") < rank("benchmarks.deploy")


def test_an_upward_import_is_caught():
    sources = {
        "fedhmc.core.rng": source(
            "fedhmc.core.rng", "def f():\n    import fedhmc.runtime.engine\n"
        ),
        "fedhmc.runtime.engine": source("fedhmc.runtime.engine", "x = 1\n"),
    }
    (bad,) = upward_imports(sources)
    assert bad == (
        "fedhmc/core/rng.py:2: fedhmc.core.rng (core) imports fedhmc.runtime.engine (runtime)"
    )


def test_the_library_importing_a_tool_is_caught():
    sources = {
        "fedhmc.runtime.engine": source(
            "fedhmc.runtime.engine", "from benchmarks.suite import x\n"
        ),
        "benchmarks.suite": source("benchmarks.suite", "x = 1\n"),
    }
    assert len(upward_imports(sources)) == 1


@pytest.mark.parametrize(
    "text",
    [
        'import importlib\nm = importlib.import_module("fedhmc_server.simulation")\n',
        'from importlib import import_module\ndef f():\n    import_module("fedhmc.runtime")\n',
        'm = __import__("fedhmc_clients.app")\n',
        'RUNNERS = {"flower": ("fedhmc_server.simulation", "run_flower")}\n',
        'RUN = "fedhmc_server.simulation:run_flower"\n',
    ],
)
def test_an_import_by_a_string_is_caught(text):
    known = {"fedhmc", "fedhmc.runtime", "fedhmc.runtime.backends", "fedhmc.runtime.config"}
    known |= {"fedhmc_server.simulation", "fedhmc_clients.app"}
    (bad,) = string_imports(source("fedhmc.runtime.backends", text), known)
    assert bad.startswith("fedhmc/runtime/backends.py:"), bad


def test_names_in_prose_and_loggers_are_not_imports():
    text = (
        '"""Sent to `fedhmc_server.simulation.run_flower`."""\n'
        'import logging\nlog = logging.getLogger("fedhmc.runtime")\n'
        'X = 1\n"""As fedhmc_server.loop does."""\n'
        'LOW = "fedhmc.runtime.config"  # a lower layer, named (say, in a message)\n'
    )
    known = {"fedhmc", "fedhmc.runtime.backends", "fedhmc.runtime.config"}
    known |= {"fedhmc_server.simulation", "fedhmc_server.loop"}
    assert string_imports(source("fedhmc.runtime.backends", text), known) == []


def test_flwr_in_the_core_is_caught():
    for text in (
        "import flwr\n",
        "from flwr.app import Message\n",
        "def f():\n    import flwr.app\n",
    ):
        assert flwr_imports(source("fedhmc.core.rng", text)), text
    assert not flwr_imports(source("fedhmc_server.app", "from flwr.app import Message\n"))


def test_a_cycle_between_two_benchmark_modules_is_caught():
    sources = {
        "benchmarks.suite": source("benchmarks.suite", "from benchmarks.threads import run\n"),
        "benchmarks.threads": source(
            "benchmarks.threads", "def run():\n    from benchmarks.suite import helper\n"
        ),
    }
    assert import_cycles(sources) == ["benchmarks.suite -> benchmarks.threads -> benchmarks.suite"]
    sources["benchmarks.threads"] = source("benchmarks.threads", "def run():\n    pass\n")
    assert import_cycles(sources) == []


def test_a_cycle_through_bare_sibling_imports_of_scripts_is_caught():
    sources = {
        "deploy.faults": source("deploy.faults", "from loopback import Deployment\n"),
        "deploy.loopback": source("deploy.loopback", "def f():\n    import faults\n"),
    }
    assert import_cycles(sources) == ["deploy.faults -> deploy.loopback -> deploy.faults"]


@pytest.mark.parametrize(
    "text",
    [
        "import sys\nsys.path.insert(0, 'deploy')\n",
        "import sys\ndef f():\n    sys.path.append('deploy')\n",
        "import sys as _s\n_s.path.extend(['deploy'])\n",
        "from sys import path\npath.insert(0, 'deploy')\n",
        "import sys\nsys.path[:0] = ['deploy']\n",
        "import sys\nsys.path += ['deploy']\n",
        "import sys\nsys.path = ['deploy', *sys.path]\n",
        "import sys\ndel sys.path[0]\n",
        "import site\nsite.addsitedir('deploy')\n",
    ],
)
def test_a_sys_path_edit_in_a_tool_is_caught(text):
    (bad,) = path_edits(source("benchmarks.deploy", text))
    assert bad.startswith("benchmarks/deploy.py:"), bad


def test_reading_sys_path_is_not_an_edit():
    text = "import sys\nprint(sys.path[0], list(sys.path))\nx = 'deploy' in sys.path\n"
    assert path_edits(source("deploy.faults", text)) == []


def test_the_earlier_module_names_are_gone():
    """One name per thing: the flat layout's re-exporting modules no longer exist."""
    import importlib.util

    for old in ("fedhmc.config", "fedhmc.engine", "fedhmc.sampler", "fedhmc.targets"):
        assert importlib.util.find_spec(old) is None, old
