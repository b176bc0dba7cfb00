"""Every repository path that the docs and deploy/faults.py name exists.

Files move (the tests went from tests/test_*.py to tests/unit/, tests/integration/ and
tests/statistical/), and a path left behind fails quietly: a page that points nowhere, or
a pytest selection that runs no test. This test reads the text, imports nothing and needs
no network.

What counts as a repository path: a word that starts with one of the repository's
top-level folders (deploy/..., tests/...py, fedhmc/...py, ...) inside a code span or a code
block, or, in deploy/faults.py, anywhere; and the target of a relative Markdown link,
resolved from the page's folder. What does not: URLs, paths under another folder
($OUT/..., ~/..., runs/..., a user's own mynets.py), and placeholders (<UTC time>, {name},
…), of which only the folder before the placeholder must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = (".ci", "benchmarks", "clients", "datasets", "deploy", "docs", "fedhmc", "notebooks")
TOP += ("server", "tests")

# A top-level folder and what follows it, not preceded by anything that would make it
# part of a longer path, a URL, a variable ($OUT/deploy/...) or a word (my_deploy/).
_PATH = re.compile(
    r"(?<![\w./$~%@:-])(?:" + "|".join(re.escape(t) for t in TOP) + r")/[^\s`'\"()\[\],;|]*"
)
_PLACEHOLDER = re.compile(r"[<>{}…]|\.\.\.|\bNAME\b|\bDIR\b")
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def named_paths(text: str, everywhere: bool = False) -> list[str]:
    """The repository paths that ``text`` names in its code spans and blocks, or
    ``everywhere`` (source code, whose strings and docstrings name paths). Links are
    ``link_targets``: they are relative to the page."""
    parts = [text] if everywhere else [m.group(0) for m in _CODE.finditer(text)]
    found = []
    for part in parts:
        for m in _PATH.finditer(part):
            path = m.group(0).rstrip(".:")
            if path not in found:
                found.append(path)
    return found


def link_targets(text: str) -> list[str]:
    """The relative targets of the Markdown links in ``text``: no URL, anchor or e-mail."""
    out = []
    for m in _LINK.finditer(text):
        target = m.group(1).split("#")[0]
        if target and not re.match(r"[a-z][a-z0-9+.-]*:", target) and target not in out:
            out.append(target)
    return out


def missing(path: str, root: Path = ROOT) -> bool:
    """Whether ``path`` (relative to ``root``) names nothing there: a file or folder, a
    glob with no match, or, for a placeholder, a folder before it that does not exist."""
    p = _PLACEHOLDER.search(path)
    if p:
        path = path[: p.start()].rpartition("/")[0]
    if any(c in path for c in "*?"):
        return not any(root.glob(path))
    return not (root / path).exists()


def stale(text: str, page: Path, root: Path = ROOT, everywhere: bool = False) -> list[str]:
    """The paths that ``text`` (the file ``page``) names and that do not exist."""
    bad = [p for p in named_paths(text, everywhere) if missing(p, root)]
    here = page.parent.relative_to(root) if page.is_absolute() else page.parent
    for target in link_targets(text):
        rel = (here / target).as_posix()
        if not target.startswith("/") and missing_link(rel, root) and target not in bad:
            bad.append(target)
    return bad


def missing_link(rel: str, root: Path) -> bool:
    """A link's target relative to the root: ``..`` resolved, inside the repository."""
    full = (root / rel).resolve()
    try:
        full.relative_to(root.resolve())
    except ValueError:
        return False  # outside the repository (a sibling checkout's page): not ours to judge
    return not full.exists()


PAGES = sorted(
    [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md", ROOT / "deploy" / "README.md"],
    key=str,
)


# ------------------------------------------------------------------------------ the repository
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page):
    bad = stale(page.read_text(), page)
    assert not bad, f"{page.relative_to(ROOT)} names paths that do not exist: {bad}"


def test_every_path_faults_py_names_exists():
    path = ROOT / "deploy" / "faults.py"
    named = named_paths(path.read_text(), everywhere=True)
    assert "tests/integration/test_flower.py" in named  # the bad-replies selections are read
    bad = [p for p in named if missing(p)]
    assert not bad, f"deploy/faults.py names paths that do not exist: {bad}"


# ------------------------------------------------------------------------------ the helpers
def test_a_stale_path_is_found():
    text = "Run `python -m pytest tests/test_deploy.py -k two_rounds` (see `deploy/README.md`)."
    assert named_paths(text) == ["tests/test_deploy.py", "deploy/README.md"]
    assert stale(text, Path("docs/x.md")) == ["tests/test_deploy.py"]


def test_a_stale_link_is_found():
    text = "[faults](../deploy/faults.py), [gone](../deploy/gone.py), [page](performance.md)"
    assert stale(text, Path("docs/x.md")) == ["../deploy/gone.py"]
    assert stale("[gone](gone.md#a-section)", Path("docs/x.md")) == ["gone.md"]


def test_code_and_links_are_read_prose_is_not():
    text = (
        "In prose, tests/test_gone.py is not read.\n"
        "```bash\nbash deploy/gone.sh\n```\n"
        "[x](https://example.org/deploy/gone.py) and [y](deploy/also_gone.py)\n"
    )
    assert named_paths(text) == ["deploy/gone.sh"]
    assert named_paths(text, everywhere=True)[0] == "tests/test_gone.py"
    assert stale(text, Path("README.md")) == ["deploy/gone.sh", "deploy/also_gone.py"]


@pytest.mark.parametrize(
    "text",
    [
        "`https://github.com/org/repo/blob/main/deploy/gone.py`",
        "`$OUT/deploy/gone.py`",
        "`~/fedhmc-deploy/deploy/gone.pid`",
        "`runs/digits/metrics.csv`",
        "`mynets.py`",
        "`fedhmc.runtime.engine`",
        "`/usr/share/datasets/fashion-mnist`",
        "`my_deploy/gone.py`",
    ],
)
def test_what_is_not_a_repository_path(text):
    assert named_paths(text) == []


def test_placeholders_and_globs():
    assert not missing("docs/results/benchmarks/<UTC time>.json")
    assert missing("docs/gone/<UTC time>.json")
    assert not missing("deploy/*.sh")
    assert missing("deploy/*.gone")
    assert not missing("fedhmc/**/*.py")
    assert not missing("deploy/")
    assert missing("tests/test_flower.py")
    assert named_paths("`deploy/faults.py`.") == ["deploy/faults.py"]
