"""The documentation site as a reader gets it: the HTML that `mkdocs build` writes.

The build itself (strict: every warning an error) runs once for the module. The checks read
every page with the standard library's HTML parser:

- no Sphinx role (``:class:``, ``:func:`` ...) left in the text;
- no unrendered maths: no ``_{``, ``^{`` or ``$`` in text outside code and maths;
- every page whose source has maths carries arithmatex's markup, and the site ships KaTeX;
- every internal link, image, script and stylesheet resolves to a file of the site, and
  every fragment of a link between pages to an id of the target page.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")
pytest.importorskip("material")

ROLE = re.compile(r":(class|func|meth|mod|attr|data|obj|exc|ref|doc):")
# Text that is left when Markdown or maths did not render: a LaTeX subscript or superscript
# group, or a maths delimiter.
UNRENDERED = re.compile(r"[_^]\{|\$")
# Maths in a Markdown source, outside code: $...$, $$ ... $$ or \( ... \).
SOURCE_MATH = re.compile(r"(?<![\\$])\$[^$\s][^$]*\$|\$\$|\\\(")
# Elements whose text is not prose: code, maths, scripts.
SKIP_TAGS = {"code", "pre", "script", "style", "kbd", "svg"}


class Page(HTMLParser):
    """Prose text (outside code and maths), ids, links and maths markup of one page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []  # (tag, skipped) of the open elements
        self.prose: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.math = 0

    def _skipping(self) -> bool:
        return any(skip for _, skip in self.stack)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if a.get("name") and tag == "a":
            self.ids.add(a["name"])
        classes = (a.get("class") or "").split()
        if "arithmatex" in classes:
            self.math += 1
        for key in ("href", "src"):
            if a.get(key) and not (tag == "link" and a.get("rel") in ("canonical", "alternate")):
                self.links.append(a[key])
        if tag in ("br", "img", "hr", "meta", "link", "input", "source", "wbr", "col", "area"):
            return
        self.stack.append((tag, tag in SKIP_TAGS or "arithmatex" in classes))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        if not self._skipping():
            self.prose.append(data)


def _source_has_math(md: Path) -> bool:
    text = md.read_text(encoding="utf-8")
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)  # fenced code
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code
    return bool(SOURCE_MATH.search(text))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield out
    shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="module")
def pages(site) -> dict[Path, Page]:
    parsed = {}
    for html in sorted(site.rglob("*.html")):
        if html.name == "404.html":
            continue
        page = Page()
        page.feed(html.read_text(encoding="utf-8"))
        parsed[html] = page
    assert len(parsed) > 30
    return parsed


def _md_sources() -> list[Path]:
    return [
        md
        for md in DOCS.rglob("*.md")
        if "cells" not in md.relative_to(DOCS).parts and md.name != "faults.md"
    ]


def _html_of(md: Path, site: Path) -> Path:
    rel = md.relative_to(DOCS).with_suffix("")
    if rel.name == "index":
        return site / rel.parent / "index.html"
    return site / rel / "index.html"


def test_no_sphinx_roles(pages, site):
    bad = {
        str(p.relative_to(site)): sorted(set(ROLE.findall("".join(page.prose))))
        for p, page in pages.items()
        if ROLE.search("".join(page.prose))
    }
    assert not bad, f"Sphinx roles left in the text: {bad}"


def test_no_unrendered_maths(pages, site):
    bad = {}
    for p, page in pages.items():
        text = "".join(page.prose)
        hits = [text[max(0, m.start() - 30) : m.end() + 30] for m in UNRENDERED.finditer(text)]
        if hits:
            bad[str(p.relative_to(site))] = hits[:5]
    assert not bad, f"unrendered maths outside code: {bad}"


def test_pages_with_maths_carry_the_markup(pages, site):
    with_math = [md for md in _md_sources() if _source_has_math(md)]
    for name in ("algorithms.md", "samplers.md", "running.md", "results/paper-protocol.md"):
        assert DOCS / name in with_math, f"{name} has no maths"
    missing = [str(md.relative_to(DOCS)) for md in with_math if pages[_html_of(md, site)].math == 0]
    assert not missing, f"pages whose maths did not reach arithmatex: {missing}"
    # KaTeX ships with the site and every page loads it from there (no CDN).
    for asset in ("katex.min.js", "katex.min.css", "contrib/auto-render.min.js"):
        assert (site / "assets" / "katex" / asset).is_file()
    assert list((site / "assets" / "katex" / "fonts").glob("*.woff2"))
    for p in (_html_of(DOCS / "algorithms.md", site),):
        links = pages[p].links
        assert any(link.endswith("assets/katex/katex.min.js") for link in links)
        assert not any("cdn" in link for link in links if "katex" in link or "mathjax" in link)


def test_internal_links_and_images_resolve(pages, site):
    broken = []
    for p, page in pages.items():
        base = "/" + p.relative_to(site).as_posix()
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue
            if not parts.path:  # a fragment of the same page
                if parts.fragment and unquote(parts.fragment) not in page.ids:
                    broken.append(f"{base}: {link}")
                continue
            here = posixpath.dirname(base)
            target = posixpath.normpath(posixpath.join(here, unquote(parts.path)))
            path = site / target.lstrip("/")
            if parts.path.endswith("/") or path.is_dir():
                path = path / "index.html"
            if not path.is_file():
                broken.append(f"{base}: {link}")
                continue
            if parts.fragment and path.suffix == ".html" and path in pages:
                if unquote(parts.fragment) not in pages[path].ids:
                    broken.append(f"{base}: {link} (no such anchor)")
    assert not broken, "broken internal links:\n" + "\n".join(broken[:40])
