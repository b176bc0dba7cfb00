"""The documentation site as a reader gets it: the HTML that `mkdocs build` writes.

The build itself (strict: every warning an error) runs once for the module. The checks read
every page with the standard library's HTML parser:

- no Sphinx role (``:class:``, ``:func:`` ...) left in the text;
- no unrendered maths: no ``_{``, ``^{`` or ``$`` in text outside code and maths;
- every page whose source has maths carries arithmatex's markup, and the site ships KaTeX;
- every internal link, image, script and stylesheet resolves to a file of the site, and
  every fragment of a link between pages to an id of the target page;
- opening a page makes no request off the machine: no script, stylesheet, font, image or
  frame from another host (Google Fonts, a CDN), no ``url()`` or ``@import`` of one in a
  stylesheet, and no repository widget whose script asks GitHub's API about the repository
  (links to other sites, followed only when clicked, are fine);
- the command-line page names every subcommand of ``fedhmc`` and every option of each.
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
    # Not --quiet: it drops mkdocs' warnings before --strict counts them, and the build passes.
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)]
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


# ----------------------------------------------------------------------- offline pages
# Elements and attributes whose URL a browser loads when it opens the page (a link's href
# is followed only when clicked; <link> loads for these rel values).
LOADED = {
    "script": ("src",),
    "img": ("src", "srcset"),
    "source": ("src", "srcset"),
    "audio": ("src",),
    "video": ("src", "poster"),
    "track": ("src",),
    "iframe": ("src",),
    "embed": ("src",),
    "object": ("data",),
    "input": ("src",),
}
LOADING_RELS = {
    "stylesheet",
    "preconnect",
    "dns-prefetch",
    "preload",
    "prefetch",
    "modulepreload",
    "icon",
    "apple-touch-icon",
    "manifest",
}
# Hosts that a page of a Material site reaches for unless told not to: Google Fonts (the
# theme's default font) and GitHub's API (the repository widget of repo_url).
KNOWN_HOSTS = ("fonts.googleapis.com", "fonts.gstatic.com", "api.github.com")
CSS_URL = re.compile(
    r"""url\(\s*['"]?\s*((?:https?:)?//[^'")\s]+)|@import\s+['"]((?:https?:)?//[^'"]+)"""
)


def _remote(url: str) -> bool:
    parts = urlsplit(url.strip())
    return bool(parts.netloc) or parts.scheme not in ("", "data", "blob")


class Requests(HTMLParser):
    """What a page loads from another host, and Material's repository widget."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.remote: list[str] = []
        self.widgets = 0
        self._style = False

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if a.get("data-md-component") == "source":
            self.widgets += 1  # Material's script fetches the repository's facts for it
        urls = []
        for key in LOADED.get(tag, ()):
            if a.get(key):
                urls += (
                    [u.split()[0] for u in a[key].split(",") if u.strip()]
                    if key == "srcset"
                    else [a[key]]
                )
        if tag == "link" and LOADING_RELS & set(a.get("rel", "").lower().split()):
            urls.append(a.get("href", ""))
        if a.get("style"):
            urls += [u for pair in CSS_URL.findall(a["style"]) for u in pair if u]
        self.remote += [f"<{tag}> {u}" for u in urls if u and _remote(u)]
        self._style = tag == "style"

    def handle_endtag(self, tag):
        self._style = False

    def handle_data(self, data):
        if self._style:
            self.remote += [f"<style> {u}" for pair in CSS_URL.findall(data) for u in pair if u]


def offline_problems(site: Path) -> list[str]:
    """Everything in the built ``site`` that makes a browser reach another host."""
    bad = []
    for html in sorted(site.rglob("*.html")):
        text = html.read_text(encoding="utf-8")
        name = str(html.relative_to(site))
        page = Requests()
        page.feed(text)
        bad += [f"{name}: loads {r}" for r in page.remote]
        if page.widgets:
            bad.append(f"{name}: the repository widget (its script asks the host's API)")
        bad += [f"{name}: names {h}" for h in KNOWN_HOSTS if h in text]
    for css in sorted(site.rglob("*.css")):
        for pair in CSS_URL.findall(css.read_text(encoding="utf-8", errors="replace")):
            bad += [f"{css.relative_to(site)}: loads {u}" for u in pair if u]
    return bad


def test_opening_a_page_makes_no_request_off_the_machine(site):
    bad = offline_problems(site)
    assert not bad, "requests off the machine:\n" + "\n".join(bad[:40])


def test_the_offline_check_finds_fonts_cdns_and_the_repository_widget(tmp_path):
    page = tmp_path / "index.html"
    page.write_text(
        "<html><head>"
        '<link rel="preconnect" href="https://fonts.gstatic.com" crossorigin>'
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        '<script src="//cdn.example.org/x.js"></script>'
        '<link rel="canonical" href="https://example.org/">'
        '<style>@import "https://example.org/a.css";</style>'
        '</head><body><a href="https://github.com/o/r" class="md-source" '
        'data-md-component="source">repo</a>'
        '<img srcset="local.png 1x, https://example.org/b.png 2x">'
        '<a href="https://example.org/">a plain link</a></body></html>'
    )
    (tmp_path / "x.css").write_text("a { background: url('https://example.org/c.png') }")
    bad = offline_problems(tmp_path)
    assert len([b for b in bad if "loads" in b]) == 6, bad
    assert any("widget" in b for b in bad)
    assert not any("a plain link" in b or "canonical" in b for b in bad)
    (tmp_path / "x.css").unlink()
    page.write_text('<html><body><a href="https://example.org/">a link</a></body></html>')
    assert offline_problems(tmp_path) == []


# ------------------------------------------------------------------- command-line page
class Sections(HTMLParser):
    """The text of every <code> element of each ``fedhmc NAME`` section (h2) of a page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.code: dict[str, set[str]] = {"": set()}
        self.current = ""
        self._code: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "h2" and (a.get("id") or "").startswith("fedhmc-"):
            self.current = a["id"].removeprefix("fedhmc-")
            self.code[self.current] = set()
        elif tag == "code":
            self._code = []

    def handle_endtag(self, tag):
        if tag == "code" and self._code is not None:
            self.code[self.current].add("".join(self._code).strip())
            self._code = None

    def handle_data(self, data):
        if self._code is not None:
            self._code.append(data)


def test_the_command_line_page_names_every_command_and_option(site):
    import argparse

    from fedhmc.cli.main import build_parser

    page = Sections()
    page.feed((site / "cli" / "index.html").read_text(encoding="utf-8"))
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, parser in sub.choices.items():
        if name not in page.code:
            missing.append(f"fedhmc {name}: no section")
            continue
        assert f"fedhmc {name}" in page.code[""], f"fedhmc {name} is not in the commands table"
        for a in parser._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            for flag in a.option_strings or [a.metavar or a.dest.upper()]:
                if flag not in page.code[name]:
                    missing.append(f"fedhmc {name} {flag}")
    assert not missing, "missing from the command-line page: " + ", ".join(missing)
    assert {"--help", "fedhmc --version"} <= page.code[""]


# ------------------------------------------------------------------ reports and changelog
def test_every_benchmark_report_is_linked_from_another_page(pages, site):
    """A report that no other page links (the nav, the benchmarks page or the changelog)
    cannot be found on the site."""
    reports = sorted(p.parent.name for p in site.glob("results/benchmarks/2*/index.html"))
    assert len(reports) == len(list((DOCS / "results" / "benchmarks").glob("2*.md")))
    linked = set()
    for p, page in pages.items():
        for link in page.links:
            target = urlsplit(link).path.rstrip("/").rsplit("/", 1)[-1]
            if target in reports and p.parent.name != target:
                linked.add(target)
    assert sorted(set(reports) - linked) == []


def test_the_changelog_page_is_changelog_md(pages, site):
    page = pages[site / "changelog" / "index.html"]
    text = " ".join("".join(page.prose).split())
    source = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^#{1,3} (.+)$", source, re.M)
    assert headings and all(h.replace("`", "") in text for h in headings)
    assert "include:" not in text


# ------------------------------------------------------------ hyphens, seen in Chromium
# Inline code (outside code blocks) must not break at a hyphen (`--max-failed-rounds` split
# over two lines reads as two options). Chromium lays every page out at a desktop and a
# phone width; for each hyphen of inline code, the hyphen and the character after it must
# be on the same line.
HYPHEN_JS = r"""
function broken(doc) {
  const out = [];
  codes: for (const code of doc.querySelectorAll('article code, .check code')) {
    if (code.closest('pre')) continue;
    const walker = doc.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const t = node.data;
      for (let i = 0; i + 1 < t.length; i++) {
        if (t[i] !== '-') continue;
        const r = doc.createRange();
        r.setStart(node, i); r.setEnd(node, i + 1); const a = r.getBoundingClientRect();
        r.setStart(node, i + 1); r.setEnd(node, i + 2); const b = r.getBoundingClientRect();
        if (a.height === 0 || b.height === 0) continue;  // not shown (a closed block)
        if (b.top >= a.bottom - 1) { out.push(code.textContent); continue codes; }
      }
    }
  }
  return out;
}
window.addEventListener('load', () => {
  const res = {};
  for (const f of document.querySelectorAll('iframe')) {
    let found;
    try { found = broken(f.contentDocument); } catch (e) { found = ['cannot read: ' + e]; }
    if (!f.contentDocument || !f.contentDocument.querySelector('article, .check'))
      found = ['the page did not load'];
    if (found.length) res[f.dataset.page + ' at ' + f.width + ' px'] = found;
  }
  const pre = document.createElement('pre');
  pre.id = 'result';
  pre.textContent = JSON.stringify(res);
  document.body.appendChild(pre);
});
"""
WIDTHS = (1280, 400)
# A page of the check's own: the same code in a narrow column, as the site marks it and
# bare. The check must find the bare one broken, or it would pass on anything.
PROBE = """<!doctype html><html><head><style>
.check { width: 7em; font: 16px monospace } .nowrap { white-space: nowrap }
</style></head><body><div class="check">
<p>see <code class="nowrap">--max-failed-rounds</code> here</p>
<p>see <code>--max-failed-rounds</code> here</p>
</div></body></html>"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def hyphen_breaks(site: Path, pages: list[str], work: Path) -> dict[str, list[str]]:
    """Page at width → the inline code that Chromium breaks at a hyphen there."""
    import html as html_lib
    import json

    frames = [("probe", (work / "probe.html").as_uri())]
    frames += [(p, (site / p).as_uri()) for p in pages]
    (work / "probe.html").write_text(PROBE, encoding="utf-8")
    body = "".join(
        f'<iframe data-page="{name}" src="{uri}" width="{w}" height="900"></iframe>'
        for name, uri in frames
        for w in WIDTHS
    )
    harness = work / "check.html"
    harness.write_text(
        f"<!doctype html><html><body>{body}<script>{HYPHEN_JS}</script></body></html>"
    )
    cmd = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-web-security",
        "--allow-file-access-from-files", f"--user-data-dir={work / 'profile'}",
        "--virtual-time-budget=120000", "--dump-dom", harness.as_uri(),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    found = re.search(r'<pre id="result">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"Chromium gave no result (status {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(html_lib.unescape(found.group(1)))


def test_inline_code_never_breaks_at_a_hyphen_in_chromium(site, tmp_path):
    if _chromium() is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    pages = sorted(str(p.relative_to(site)) for p in site.rglob("index.html"))
    got = hyphen_breaks(site, pages, tmp_path)
    probe = {k: v for k, v in got.items() if k.startswith("probe ")}
    assert probe == {f"probe at {w} px": ["--max-failed-rounds"] for w in WIDTHS}, probe
    broken = {k: v for k, v in got.items() if not k.startswith("probe ")}
    assert not broken, f"inline code broken at a hyphen: {broken}"


def test_the_site_marks_inline_code_so_that_hyphens_hold():
    import importlib.util

    spec = importlib.util.spec_from_file_location("site_hooks", ROOT / "tools" / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    html = (
        "<p><code>--burn-in</code> and <code>fedhmc run --resume DIR</code> and <code>x</code></p>"
        "<pre><code>fedhmc run --max-failed-rounds 2</code></pre>"
    )
    assert hooks.keep_hyphens(html) == (
        '<p><code class="nowrap">--burn-in</code> and <code>fedhmc run '
        '<span class="nowrap">--resume</span> DIR</code> and <code>x</code></p>'
        "<pre><code>fedhmc run --max-failed-rounds 2</code></pre>"
    )
    css = (DOCS / "assets" / "css" / "extra.css").read_text(encoding="utf-8")
    assert re.search(r"^\.md-typeset \.nowrap \{\s*white-space: nowrap;", css, re.M)
